set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-7
date +%T > $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 150 $B/cuda-test --test-threads=1 model_file batch_decodes_like batch_verify_rows gpu_matches_cpu half_warp 2>&1 | grep -E "^test |test result" | tee $O/tests-1.5b.txt
date +%T >> $O/state.txt
date +%T >> $O/state.txt
MENS_CUDA_OMIT="LM head" timeout 60 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/1.5b OMIT=LM head: /" | tee $O/omit.txt
timeout 60 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/1.5b: /" | tee -a $O/omit.txt

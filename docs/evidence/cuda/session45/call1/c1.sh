set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-45
date +%T > $O/state.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> $O/state.txt
# The suite on aeaed05 (session 44's logit-bias check in the batch sampling test is new), then the decode/verify/model-file subsets on the 1.5B and 7B files.
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
for s in 1.5b 7b; do MENS_CUDA_MODEL=/tmp/mens-models/synth-$s.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture batch_decodes_like model_file batch_verify_rows gpu_matches_cpu 2>&1 | grep -E "^test |test result|FAILED|panicked|rel L2 median|bit for bit|greedy tokens equal" | sed "s/^/$s /"; done | tee $O/tests-1.5b-7b.txt
# Decode and the verify pass on the 7B (issue 18's table), the figures this session starts from.
m=/tmp/mens-models/synth-7b.gguf
timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --gen 128 --reps 3 --paired 0 -q --depth 0,512 2>&1 | grep -E "^\| tg" | sed "s/^/7b: /" | tee $O/bench-7b.txt
timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 2>&1 | grep -iE "verify|step" | sed "s/^/7b: /" | tee -a $O/bench-7b.txt
date +%T >> $O/state.txt

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test llama-cuda/llama-bench; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-1
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt 2>&1
date +%T > $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
date +%T >> $O/state.txt
b() { l=$1; shift; env "$@" timeout 60 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0,256,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $l: /"; }
for s in 0.5b 1.5b 7b; do m=/tmp/mens-models/synth-$s.gguf
  $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0 --gen 32 --reps 1 --paired 0 -q >/dev/null 2>&1
  timeout 90 $B/llama-bench -m $m -ngl 99 -fa 1 -p 0 -n 128 -d 0,256,512 -r 3 -o md 2>&1 | grep -E "tg128|rror" | sed "s/^/$s llama.cpp: /"
  for r in 1 2; do b ahead X=1; b plain MENS_CUDA_AHEAD=0; done
done | tee $O/decode.txt
date +%T >> $O/state.txt

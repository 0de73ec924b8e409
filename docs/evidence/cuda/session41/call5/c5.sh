set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test llama-cuda/llama-bench; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-5
date +%T > $O/state.txt
# the suite: every model defers its norms now (tiny ones, the synth 0.5B)
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 220 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
date +%T >> $O/state.txt
for s in 1.5b 7b; do MENS_CUDA_MODEL=/tmp/mens-models/synth-$s.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture model_file batch_decodes_like batch_verify_rows gpu_matches_cpu half_warp ahead generate_and 2>&1 | grep -E "^test |test result|FAILED|panicked|rel L2 median|bit for bit" | sed "s/^/$s /"; done | tee $O/tests-1.5b-7b.txt
date +%T >> $O/state.txt
b() { l=$1; shift; env "$@" timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --gen 128 --reps 3 --paired 0 -q --depth 0,256,512 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $l: /"; }
for s in 0.5b 1.5b 7b; do m=/tmp/mens-models/synth-$s.gguf
  $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0 --gen 32 --reps 1 --paired 0 -q >/dev/null 2>&1
  timeout 90 $B/llama-bench -m $m -ngl 99 -fa 1 -p 0 -n 128 -d 0,256,512 -r 3 -o md 2>&1 | grep -E "tg128|rror" | sed "s/^/$s llama.cpp: /"
  for r in 1 2; do b defer X=1; b norms MENS_CUDA_NORM_DEFER=0; done
done | tee $O/decode.txt
date +%T >> $O/state.txt
for s in 0.5b 1.5b 7b; do m=/tmp/mens-models/synth-$s.gguf; timeout 100 $B/mens bench -m $m --backend cuda --prompt 512 --steps 0 --reps 3 --paired 0 -q 2>&1 | grep -E "prefill|pp512" | sed "s/^/$s /"; timeout 90 $B/llama-bench -m $m -ngl 99 -fa 1 -p 512 -n 0 -r 3 -o md 2>&1 | grep -E "pp512" | sed "s/^/$s llama.cpp: /"; done | tee $O/prefill.txt
for s in 0.5b 1.5b 7b; do m=/tmp/mens-models/synth-$s.gguf; timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 -q --verify 1,2,4,8,16 --verify-depth 512 2>&1 | grep -E "verify" | sed "s/^/$s /"; done | tee $O/verify.txt
m=/tmp/mens-models/synth-7b.gguf
timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 512 --reps 1 --paired 0 --profile 2>&1 | grep -E "^\||Kernels" | tail -12 > $O/profile-7b.txt
timeout 60 $B/mens run -m $m --backend cuda -n 200 --temp 0 -p "def fib(n):" 2>&1 >/dev/null | tail -1 | tee $O/run-7b.txt
date +%T >> $O/state.txt

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-1
date +%T > $O/state.txt
# the deferred norms on the 7B: GPU against CPU (teacher-forced), and greedy text alike
MENS_CUDA_NORM_DEFER=1 MENS_CUDA_MODEL=/tmp/mens-models/synth-7b.gguf timeout 150 $B/cuda-test --test-threads=1 --nocapture model_file 2>&1 | grep -E "test result|FAILED|panicked|rel L2|argmax" | head -12 | tee $O/tests-7b.txt
date +%T >> $O/state.txt
b() { l=$1; shift; env "$@" timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --gen 128 --reps 3 --paired 0 -q --depth 0,256,512 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $l: /"; }
for s in 7b; do m=/tmp/mens-models/synth-$s.gguf
  $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0 --gen 32 --reps 1 --paired 0 -q >/dev/null 2>&1
  for r in 1 2; do b norms MENS_CUDA_NORM_DEFER=0; b defer MENS_CUDA_NORM_DEFER=1; done
done | tee $O/decode.txt
date +%T >> $O/state.txt
m=/tmp/mens-models/synth-7b.gguf
for v in 0 1; do MENS_CUDA_NORM_DEFER=$v timeout 60 $B/mens run -m $m --backend cuda -n 64 --temp 0 -p "def fib(n):" 2>/dev/null | md5sum | sed "s/^/defer=$v text /"; done | tee $O/run.txt
MENS_CUDA_NORM_DEFER=1 timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 512 --reps 1 --paired 0 --profile 2>&1 | grep -iE "matvec|norm|attn|glu|qkv|step|head" | head -30 > $O/profile-defer.txt
date +%T >> $O/state.txt

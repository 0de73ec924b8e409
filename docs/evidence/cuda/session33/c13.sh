set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
date +%T > $O/state.txt
# 1. the tests with an empty JIT cache (both modules)
CUDA_CACHE_PATH=/tmp/jit-2 MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
date +%T >> $O/state.txt
# 2. a single-sequence run with the driver's JIT cache empty: only the main module is made
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "first run, main module only: %e s" timeout 90 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 64 --reps 1 --paired 0 > $O/first.txt 2>&1
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "second run: %e s" timeout 60 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 64 --reps 1 --paired 0 >> $O/first.txt 2>&1
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "first verify (batch module made): %e s" timeout 90 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 512 >> $O/first.txt 2>&1
date +%T >> $O/state.txt
grep -E "memory plan|first|second|tg|verify" $O/first.txt
export CUDA_CACHE_PATH=/tmp/jit-2
# 3. decode with the staged matvec (O, down) against the plain one, alternating
dv() { s=$1; r=$2; v=$3; shift 3; env "$@" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $v: /"; }
for r in 1 2; do for s in 7b 1.5b 0.5b; do dv $s $r plain X=1; dv $s $r s0 MENS_CUDA_MATVEC_S=0; dv $s $r s4 MENS_CUDA_MATVEC_S=4; done; done > $O/decode.txt
date +%T >> $O/state.txt
MENS_CUDA_MATVEC_S=0 MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b-s0.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b-s0.log | head -5
MENS_CUDA_MATVEC_S=0 MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 60 $B/cuda-test tiny --test-threads=1 > $O/tests-tiny-s0.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests-tiny-s0.log | head -5
date +%T >> $O/state.txt
cat $O/decode.txt $O/state.txt

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
date +%T > $O/state.txt
export CUDA_CACHE_PATH=/tmp/jit-2
for m in mens mens-prev; do timeout 200 $B/$m bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked|split" $O/cuda-tests.log | head -10
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
dv() { s=$1; r=$2; m=$3; timeout 90 $B/$m bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $m: /"; }
for r in 1 2; do for s in 1.5b 0.5b 7b; do dv $s $r mens-prev; dv $s $r mens; done; done > $O/decode.txt
date +%T >> $O/state.txt
vf() { s=$1; r=$2; m=$3; timeout 90 $B/$m bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r $m: /"; }
for r in 1 2; do for s in 1.5b 7b; do vf $s $r mens-prev; vf $s $r mens; done; done > $O/verify.txt
date +%T >> $O/state.txt
cf() { m=$1; timeout 120 $B/$m bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -E "sequences together" | sed "s/^/$m: /"; }
for m in mens-prev mens mens-prev mens; do cf $m; done > $O/concurrency.txt
date +%T >> $O/state.txt
cat $O/decode.txt $O/verify.txt $O/concurrency.txt $O/state.txt

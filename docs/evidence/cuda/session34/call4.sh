set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
date +%T > $O/state.txt
export CUDA_CACHE_PATH=/tmp/jit-2
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 16 --reps 1 --paired 0 -q > /dev/null 2>&1
date +%T >> $O/state.txt
dv() { s=$1; r=$2; v=$3; shift 3; env "$@" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $v: /"; }
for r in 1 2; do for s in 7b 1.5b 0.5b; do dv $s $r plain X=1; dv $s $r down2 MENS_CUDA_DOWN2=1; done; done > $O/decode.txt
date +%T >> $O/state.txt
cat $O/decode.txt
MENS_CUDA_DOWN2=1 MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b-down2.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b-down2.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 8 --reps 1 --paired 0 -q > /dev/null 2>&1
date +%T >> $O/state.txt
run() { # name, model, env...
  local n=$1 s=$2; shift 2
  env "$@" timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r $n: /"
}
for r in 1 2; do
  run default 0.5b X=1; run fuse0 0.5b MENS_CUDA_NORM_FUSE=0; run glu16 0.5b MENS_CUDA_GLU_WARPS=16; run split0 0.5b MENS_CUDA_SPLIT=0
  run default 1.5b X=1; run fuse1 1.5b MENS_CUDA_NORM_FUSE=1; run glu4 1.5b MENS_CUDA_GLU_WARPS=4; run glu16 1.5b MENS_CUDA_GLU_WARPS=16; run split0 1.5b MENS_CUDA_SPLIT=0
  run default 7b X=1; run split1 7b MENS_CUDA_SPLIT=1
done | tee $O/decode.txt
date +%T >> $O/state.txt

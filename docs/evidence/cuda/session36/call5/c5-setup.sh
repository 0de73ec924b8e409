set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
for D in "" "-DWLD=0"; do (MENS_CUDA_DEFINES="$D" timeout 100 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 -q > /dev/null 2>&1) & done; wait
date +%T > $O/state.txt
for r in 1 2; do for s in 0.5b 1.5b 7b; do for D in "" "-DWLD=0"; do
  MENS_CUDA_DEFINES="$D" timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 512,2048 --steps 0 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| pp|rror" | sed "s/^/$s r$r '$D': /"
done; done; done | tee $O/prefill.txt
date +%T >> $O/state.txt

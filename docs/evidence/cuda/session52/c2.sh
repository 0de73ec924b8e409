set -u
# Session 52, call 2: the verify table (issue 18) for the 1.5B and 0.5B shapes on the card call 1
# got (the 7B's is in call 1), default kernels, each with its decode figures.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens; do [ -x $B/$f ] || { un .device/$f.xz $B/$f; chmod +x $B/$f; }; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-52
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do g="$MENS_CUDA_CACHE/$(basename "$f" .xz)"; [ -f "$g" ] || un "$f" "$g"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $L
for s in 7b 1.5b 0.5b; do
  m=$M/synth-$s.gguf
  [ -f $m ] || $B/mens synth --shape $s -o $m > /dev/null 2>&1
  echo "== $s ($SECONDS s)" >> $L
  timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 512 --gen 64 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q > $O/verify-$s.txt 2>&1
  grep -E "^\|" $O/verify-$s.txt | head -14 >> $L
done
echo "== done ($SECONDS s)" >> $L

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-4
b() { l=$1; shift; env "$@" timeout 100 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --gen 128 --reps 3 --paired 0 -q $ARGS 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $l: /"; }
for s in 0.5b 7b; do m=/tmp/mens-models/synth-$s.gguf
  $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0 --gen 32 --reps 1 --paired 0 -q >/dev/null 2>&1
  ARGS="-c 32768 --depth 0,512,4096,16384"
  if [ $s = 7b ]; then W="19 38 76"; else W="38 76 151"; fi
  for r in 1 2; do for w in $W; do b "workers $w" MENS_CUDA_ATTN_WORKERS=$w; done; done
done | tee $O/decode.txt

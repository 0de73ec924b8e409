set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
grep -E "^test .*(ahead|generate_and)" $O/tests.log
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file batch_decodes_like batch_verify_rows gpu_matches_cpu half_warp ahead generate_and 2>&1 | grep -E "test result|FAILED|panicked|rel L2 median|bit for bit" | head -12 | tee $O/tests-1.5b.txt
date +%T >> $O/state.txt
# mens run, greedy, steps run ahead or not: the same text; and the timing lines.
for s in 0.5b 7b; do m=/tmp/mens-models/synth-$s.gguf
  for a in 1 0; do MENS_CUDA_AHEAD=$a timeout 60 $B/mens run -m $m --backend cuda -n 200 --temp 0 -p "def fib(n):" > $O/run-$s-$a.txt 2> $O/run-$s-$a.err; done
  cmp $O/run-$s-1.txt $O/run-$s-0.txt && echo "$s: same text ($(wc -c < $O/run-$s-1.txt) bytes)"; tail -2 $O/run-$s-1.err; tail -2 $O/run-$s-0.err
done
date +%T >> $O/state.txt

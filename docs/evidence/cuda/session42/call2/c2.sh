set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-1
date +%T > $O/state.txt
# The deferred norm's kernel tests (the sums compared over the written groups), then the suite.
timeout 120 $B/cuda-test --test-threads=1 --nocapture deferred 2>&1 | tee $O/deferred.log | grep -E "^test |test result|rel L2|panicked|left|right" | cut -c1-300
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 240 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12 | cut -c1-300
date +%T >> $O/state.txt

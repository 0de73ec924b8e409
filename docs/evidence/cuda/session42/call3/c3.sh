set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
$B/mens synth --shape 0.5b -o /tmp/mens-models/synth-0.5b.gguf >/dev/null 2>&1
export CUDA_CACHE_PATH=/tmp/jit-1
date +%T > $O/state.txt
# After the tests' shared setup became one helper (same inputs): the suite.
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12 | cut -c1-300
grep -E "deferred gate/up|^test (deferred|gate_up|kernels_that)" $O/tests.log | cut -c1-200
date +%T >> $O/state.txt

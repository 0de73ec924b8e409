set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
date +%T > $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 100 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-6
date +%T > $O/state.txt
# the synth 7B's batch test, with the deferred norms and without (is its failure theirs?)
for v in 1 0; do MENS_CUDA_NORM_DEFER=$v MENS_CUDA_MODEL=/tmp/mens-models/synth-7b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture batch_decodes_like 2>&1 | grep -vE "^\s+[0-9]+:|^\s+at " | head -30 | sed "s/^/defer=$v /"; done | tee $O/tests-7b-batch.txt
date +%T >> $O/state.txt

set -u
# Session 51, call 3: a slot decoding alone runs the session's single-sequence graph, so the batch
# rows are compared with the decode step's kernels, not with a batch of one. Qwen3's two pairs
# that differ from Qwen2's: the stacked Q/K/V matmul against the decode matvec
# (stacked_matmul_rows_equal_rows_alone, now also against test_matvec_stacked) and rope_store_b
# against the session's rope_store (rope_store_b_gives_rope_stores_bits).
O=$OUT; B=/tmp/mens-bin; mkdir -p $B
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
un .device/cuda-test.xz $B/cuda-test; chmod +x $B/cuda-test
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-51
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $L
timeout 240 $B/cuda-test --test-threads=1 --nocapture stacked_matmul rope_store_b > $O/t.txt 2>&1
grep -E "^test |test result|panicked|differ|against" $O/t.txt | cut -c1-600 | head -30 >> $L
echo "== done ($SECONDS s)" >> $L

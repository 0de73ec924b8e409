set -u
# Session 50, call 2: where batch rows part from rows alone: three stacked matrices of different
# types in one batched matmul (Qwen3's Q/K/V) row by row against alone; and qwen2, qwen3, qwen3moe
# with 3 slots (a padding row), 4, 2, and 3 slots whose rows are alike but for their slots.
O=$OUT; B=/tmp/mens-bin; mkdir -p $B
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
un .device/cuda-test.xz $B/cuda-test; chmod +x $B/cuda-test
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-50
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
timeout 150 $B/cuda-test --test-threads=1 --nocapture stacked_matmul batch_rows_equal > $O/t.txt 2>&1
grep -E "^test |test result|panicked|together and alone|bit for bit|differ alone" $O/t.txt | cut -c1-400

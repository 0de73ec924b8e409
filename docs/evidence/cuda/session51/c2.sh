set -u
# Session 51, call 2: Qwen3's batch rows part from rows alone at a random step (call 1), not from
# the first: something timing- or data-dependent. compute-sanitizer's racecheck, initcheck and
# synccheck over the failing test; then the test with ffn_down's split rows off
# (MENS_CUDA_SPLIT=0: only the dense Qwen3 takes them here) and with one attention worker.
O=$OUT; B=/tmp/mens-bin; mkdir -p $B
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
un .device/cuda-test.xz $B/cuda-test; chmod +x $B/cuda-test
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-51
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $L
T="qwen3_batch_rows_equal_rows_alone --include-ignored --test-threads=1 --nocapture"
pick() { grep -E "^test |test result|together and alone|as alone|========|ERROR SUMMARY|Race|Uninitialized|at 0x|in [a-z_]+[0-9a-z_]*\(|by thread|Invalid" "$1" | cut -c1-300 | head -${2:-40} >> $L; }
for v in "MENS_CUDA_SPLIT=0" "MENS_CUDA_ATTN_WORKERS=1" "MENS_CUDA_SPLIT=0 MENS_CUDA_ATTN_HG=1"; do
  echo "== $v ($SECONDS s)" >> $L
  env $v timeout 60 $B/cuda-test $T > $O/v.txt 2>&1; pick $O/v.txt 14
done
for tool in initcheck racecheck synccheck; do
  echo "== compute-sanitizer --tool $tool ($SECONDS s)" >> $L
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool $tool --print-limit 8 $B/cuda-test $T > $O/$tool.txt 2>&1
  echo "rc $?" >> $L; pick $O/$tool.txt 50
done
echo "== done ($SECONDS s)" >> $L

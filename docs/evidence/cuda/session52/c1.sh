set -u
# Session 52, call 1 (session 51's c4.sh, which never ran; the stacked matmul test added): RoPE's
# products rounded apart in every RoPE kernel (rope_rot in kernels/common.cuh): rope_store_b against
# rope_store, Qwen3 and Qwen3-MoE batch rows against rows alone (no longer ignored), then the
# whole CUDA suite on the synthetic 0.5B.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens cuda-test; do un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-52
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $L
m=$M/synth-0.5b.gguf
$B/mens synth --shape 0.5b -o $m > /dev/null 2>&1
echo "== the fix's tests ($SECONDS s)" >> $L
timeout 150 $B/cuda-test --test-threads=1 --nocapture rope_store_b batch_rows_equal moe_batch_decodes stacked_matmul > $O/t.txt 2>&1
grep -E "^test |test result|panicked|differ|as alone|equal its" $O/t.txt | cut -c1-400 | head -30 >> $L
echo "== suite ($SECONDS s)" >> $L
MENS_CUDA_MODEL=$m timeout 240 $B/cuda-test --test-threads=1 --skip rope_store_b --skip batch_rows_equal --skip moe_batch_decodes --skip stacked_matmul > $O/suite.txt 2>&1
grep -E "^test .*(ok|FAILED|ignored)$|test result|panicked" $O/suite.txt | cut -c1-200 | tail -70 >> $L
echo "== done ($SECONDS s)" >> $L
# The verify pass with each batch kernel family forced (dp4a: decode's bits; mma and cuBLAS: not).
s=$M/synth-7b.gguf
$B/mens synth --shape 7b -o $s > /dev/null 2>&1
for fam in dp4a mma dp4a; do
  echo "== verify, 7B, MENS_CUDA_BATCH=$fam ($SECONDS s)" >> $L
  MENS_CUDA_BATCH=$fam timeout 120 $B/mens bench -m $s --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q > $O/verify-$fam.txt 2>&1
  grep -iE "verify|decode" $O/verify-$fam.txt | head -12 >> $L
done
echo "== done ($SECONDS s)" >> $L

set -u
# (Call 1 ran a build with fscale() in kernels/matvec.cu: float chunks scaled with __fmul_rn, or
# the old product under -DFLOAT_DOT_FMA. Both gave the same failures, so the change was not kept.)
# Session 51, call 1: where Qwen3's batch rows part from rows alone. Three stacked matrices of
# different types in one batched matmul (Qwen3's Q/K/V; an F16 one among them) row by row against
# alone; qwen3 and qwen3moe with 3 slots (a padding row), 4, 2 and 3 alike; both with the float
# chunks' scale rounded before the add (this session's fix) and in the old form
# (-DFLOAT_DOT_FMA); then the whole CUDA suite on the synthetic 0.5B.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens cuda-test; do un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-51
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $L
m=$M/synth-0.5b.gguf
$B/mens synth --shape 0.5b -o $m > /dev/null 2>&1
pick() { grep -E "^test |test result|panicked|together and alone|bit for bit|differ alone|as alone|left|right" "$1" | cut -c1-400 | head -40 >> $L; }
for defs in "" "-DFLOAT_DOT_FMA"; do
  echo "== defines '$defs' ($SECONDS s)" >> $L
  MENS_CUDA_DEFINES="$defs" timeout 200 $B/cuda-test --test-threads=1 --nocapture --include-ignored \
    stacked_matmul batch_rows_equal moe_batch_decodes > $O/t$defs.txt 2>&1
  pick $O/t$defs.txt
done
echo "== suite ($SECONDS s)" >> $L
MENS_CUDA_MODEL=$m timeout 330 $B/cuda-test --test-threads=1 --nocapture --skip stacked_matmul --skip batch_rows_equal --skip moe_batch_decodes > $O/suite.txt 2>&1
grep -E "^test .*(ok|FAILED)$|test result|panicked" $O/suite.txt | cut -c1-200 | tail -70 >> $L
echo "== done ($SECONDS s)" >> $L

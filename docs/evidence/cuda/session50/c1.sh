set -u
# Session 50, call 1: the MoE and hidden-state tests with the prompt tiles (moe_glu_tiles,
# moe_down_tiles: first run on a GPU); batch rows against rows alone (qwen2, qwen3, qwen3moe),
# again with attention head groups fixed at 1 where they differ; the rest of the CUDA suite on the
# synthetic 0.5B; then the 30B-A3B shape's prefill and decode, time allowing.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens cuda-test; do un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-50
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
L=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $L
m=$M/synth-0.5b.gguf; m30=$M/synth-30b-a3b.gguf
$B/mens synth --shape 0.5b -o $m > /dev/null 2>&1
( time $B/mens synth --shape 30b-a3b -o $m30 ) > $O/synth-30b.txt 2>&1 &
SYN=$!
echo "== new tests ($SECONDS s)" >> $L
timeout 170 $B/cuda-test --test-threads=1 --nocapture batch_rows_equal moe hidden > $O/t1.txt 2>&1
grep -E "^test |test result|panicked|together and alone|bit for bit|rel L2|left|right|as alone" $O/t1.txt | cut -c1-300 | head -40 >> $L
if grep -q FAILED $O/t1.txt; then
  echo "== MENS_CUDA_ATTN_HG=1 ($SECONDS s)" >> $L
  MENS_CUDA_ATTN_HG=1 timeout 80 $B/cuda-test --test-threads=1 --nocapture batch_rows_equal moe_batch > $O/t2.txt 2>&1
  grep -E "^test |test result|panicked|together and alone|as alone|left|right" $O/t2.txt | cut -c1-300 | head -20 >> $L
fi
echo "== suite ($SECONDS s)" >> $L
MENS_CUDA_MODEL=$m timeout 300 $B/cuda-test --test-threads=1 --nocapture --skip batch_rows_equal --skip moe --skip hidden > $O/suite.txt 2>&1
grep -E "^test .*(ok|FAILED)$|test result|panicked" $O/suite.txt | cut -c1-200 | tail -70 >> $L
echo "== 30B ($SECONDS s)" >> $L
if [ $SECONDS -lt 420 ]; then
  wait $SYN; tail -3 $O/synth-30b.txt >> $L
  timeout 120 $B/mens bench -m $m30 --backend cuda --prompt 512 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q \
    2>&1 | grep -E "^\| (TTFT|prefill|tg)|rror|loaded" >> $L
fi
echo "== done ($SECONDS s)" >> $L

set -u
# Session 49, call 3: batch rows against rows alone for qwen2, qwen3 and qwen3moe (teacher-forced,
# bit for bit), the MoE tests with the prompt tiles (moe_glu_tiles, moe_down_tiles), then the
# 30B-A3B shape's prefill and decode (and a decode profile) with them.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens cuda-test; do un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-49
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
if ls .device/llama-cuda/*.xz >/dev/null 2>&1; then
  mkdir -p $B/llama
  for f in .device/llama-cuda/*.xz; do un "$f" "$B/llama/$(basename "$f" .xz)"; chmod +x "$B/llama/$(basename "$f" .xz)"; done
fi
L=$O/c3.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $L
[ -f $M/synth-30b-a3b.gguf ] || $B/mens synth --shape 30b-a3b -o $M/synth-30b-a3b.gguf > /dev/null 2>&1 &
SYN=$!
timeout 300 $B/cuda-test --test-threads=1 --nocapture ${TESTS:-batch_rows_equal moe hidden} > $O/tests.txt 2>&1
grep -E "test result|FAILED|panicked|moe|hidden|qwen3|qwen2|left|right" $O/tests.txt | grep -v "^\s" | head -40 >> $L
wait $SYN
m30=$M/synth-30b-a3b.gguf
for round in ${ROUNDS:-1}; do
  if [ -x "$B/llama/llama-bench" ]; then
    "$B/llama/llama-bench" -m $m30 -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>/dev/null \
      | grep -E "pp512|tg128" | sed "s/^/round $round, llama.cpp: /"
  fi
  $B/mens bench -m $m30 --backend cuda --prompt 512 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q \
    2>&1 | grep -E "^\| (TTFT|prefill|tg)|rror" | sed "s/^/round $round, mens: /"
done >> $L 2>&1
$B/mens bench -m $m30 --backend cuda --prompt 16 --steps 256 --reps 1 --paired 0 -q --profile --md $O/profile-30b.md > /dev/null 2>&1
head -40 $O/profile-30b.md >> $L

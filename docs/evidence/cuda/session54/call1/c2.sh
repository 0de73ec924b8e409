set -u
# Session 53: NEVER RAN (no device machine could be started in the session). For
# batch-pdl-untested.patch (`git am` it, then scripts/cuda-build.sh): the batched step's graph with
# programmatic dependent launch (the dp4a family: batch.cu's kernels wait at pdl_wait(), the matrix
# kernels trigger after their last tile). The CUDA suite with it (the default), then
# MENS_CUDA_PDL=0 (the graph as before) against the default, alternating: the verify pass (issue
# 18) and the server's batched step.
. scripts/device-setup.sh
O=$OUT; L=$O/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L
$BIN/mens synth --shape 0.5b -o $M/synth-0.5b.gguf > /dev/null 2>&1
echo "== suite ($SECONDS s)" >> $L
MENS_CUDA_MODEL=$M/synth-0.5b.gguf timeout 300 $BIN/cuda-test --test-threads=1 > $O/suite.txt 2>&1
grep -E "^test .*(ok|FAILED|ignored)$|test result|panicked" $O/suite.txt | cut -c1-200 | tail -70 >> $L
for s in 1.5b 7b; do $BIN/mens synth --shape $s -o $M/synth-$s.gguf > /dev/null 2>&1; done
for r in 1 2; do
  for pdl in 0 1; do
    for s in 7b 1.5b 0.5b; do
      echo "== verify $s, MENS_CUDA_PDL=$pdl, round $r ($SECONDS s)" >> $L
      MENS_CUDA_PDL=$pdl timeout 100 $BIN/mens bench -m $M/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 512 --gen 64 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q > $O/verify-$s-pdl$pdl-r$r.txt 2>&1
      grep -E "tg64|verify" $O/verify-$s-pdl$pdl-r$r.txt >> $L
    done
  done
done
for r in 1 2; do
  for pdl in 0 1; do
    for s in 1.5b 0.5b; do
      echo "== concurrency $s, MENS_CUDA_PDL=$pdl, round $r ($SECONDS s)" >> $L
      MENS_CUDA_PDL=$pdl timeout 100 $BIN/mens bench -m $M/synth-$s.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q > $O/conc-$s-pdl$pdl-r$r.txt 2>&1
      grep -E "^\|" $O/conc-$s-pdl$pdl-r$r.txt | head -12 >> $L
    done
  done
done
echo "== done ($SECONDS s)" >> $L

set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
date +%T > $O/state.txt
export CUDA_CACHE_PATH=/tmp/jit-2
M=("" 2 2); D=("" "" "-DMR_MINB=3")
N=(dp4a mr mr3)
for i in 0 1 2; do env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture batched > $O/tests-batched.log 2>&1
grep -E "test result|FAILED|panicked|copy engine: true" $O/tests-batched.log | head -12
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1 2; do vf 7b $r $i; done; done > $O/verify.txt
for i in 0 1 2; do vf 1.5b 1 $i; done >> $O/verify.txt
date +%T >> $O/state.txt
for i in 2; do env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 100 $B/cuda-test --test-threads=1 batched > $O/tests-${N[$i]}.log 2>&1; grep -E "test result|FAILED|panicked" $O/tests-${N[$i]}.log | sed "s/^/${N[$i]}: /" | head -5; done
date +%T >> $O/state.txt
cat $O/verify.txt $O/state.txt
rm -f $O/jit-*.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for i in 0 1; do env "MENS_CUDA_MQ_FROM=${M[$i]}" timeout 200 $NCU --clock-control none -k "regex:glu_mr_q4kr|glu_q8_b_8_q4kr|matmul_mr_q4kr|matmul_q8_8_q4kr" --launch-skip 60 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy $B/mens bench -m /tmp/mens-models/synth-7b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 512 -q > $O/ncu-${N[$i]}.txt 2>&1; done
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Issued Warp|Warp Cycles Per Issued|Achieved Occupancy|Compute \(SM\)" $O/ncu-*.txt | head -60
date +%T >> $O/state.txt

# The seven device calls of session 34, as run (each as `bash .device/cNN.sh` with .device carried).
# Every call began with the setup of call 1 (unpack the binaries and the PTX, make the synthetic
# models); calls 2-7 list only what followed it (call 7 ran call 6's script again, on 8a42d5f). Call 5 also unpacked .device/prev/mens.xz (the
# binary before the split down) to $B/mens-prev and its PTX.

# ---- call 1
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
date +%T > $O/state.txt
export CUDA_CACHE_PATH=/tmp/jit-2
M=("" 2 2 2); D=("" "" "-DMR_MINB=3" "-DMR_STAGES=3 -DMR_MINB=3")
N=(dp4a mr mr3 mr3s3)
for i in 0 1 2 3; do env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture batched > $O/tests-batched.log 2>&1
grep -E "test result|FAILED|panicked|copy engine: true" $O/tests-batched.log | head -12
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1 2 3; do vf 7b $r $i; done; done > $O/verify.txt
for i in 0 1 2; do vf 1.5b 1 $i; done >> $O/verify.txt
date +%T >> $O/state.txt
for i in 2 3; do env "MENS_CUDA_MQ_FROM=${M[$i]}" "MENS_CUDA_DEFINES=${D[$i]}" MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 100 $B/cuda-test --test-threads=1 batched > $O/tests-${N[$i]}.log 2>&1; grep -E "test result|FAILED|panicked" $O/tests-${N[$i]}.log | sed "s/^/${N[$i]}: /" | head -5; done
date +%T >> $O/state.txt
cat $O/verify.txt $O/state.txt
rm -f $O/jit-*.txt

# ---- call 2
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

# ---- call 3
export CUDA_CACHE_PATH=/tmp/jit-2
M=("" 2); N=(dp4a mr)
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture batched copy_engine > $O/tests-batched.log 2>&1
grep -E "test result|FAILED|panicked|copy engine: true|glu_mr" $O/tests-batched.log | head -12
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "MENS_CUDA_MQ_FROM=${M[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1; do vf 7b $r $i; done; done > $O/verify.txt
for i in 0 1; do vf 1.5b 1 $i; done >> $O/verify.txt
date +%T >> $O/state.txt
cat $O/verify.txt $O/state.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
MENS_CUDA_MQ_FROM=2 timeout 200 $NCU --clock-control none -k "regex:glu_mr_q4kr|matmul_mr_q4kr" --launch-skip 60 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy $B/mens bench -m /tmp/mens-models/synth-7b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 512 -q > $O/ncu-mr.txt 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|L1/TEX Cache|Issued Warp|Warp Cycles Per Issued|Achieved Occupancy|Compute \(SM\)" $O/ncu-mr.txt | head -30
date +%T >> $O/state.txt

# ---- call 4
export CUDA_CACHE_PATH=/tmp/jit-2
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 16 --reps 1 --paired 0 -q > /dev/null 2>&1
date +%T >> $O/state.txt
dv() { s=$1; r=$2; v=$3; shift 3; env "$@" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $v: /"; }
for r in 1 2; do for s in 7b 1.5b 0.5b; do dv $s $r plain X=1; dv $s $r down2 MENS_CUDA_DOWN2=1; done; done > $O/decode.txt
date +%T >> $O/state.txt
cat $O/decode.txt
MENS_CUDA_DOWN2=1 MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b-down2.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b-down2.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt

# ---- call 5
export CUDA_CACHE_PATH=/tmp/jit-2
for m in mens mens-prev; do timeout 200 $B/$m bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked|split" $O/cuda-tests.log | head -10
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
dv() { s=$1; r=$2; m=$3; timeout 90 $B/$m bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $m: /"; }
for r in 1 2; do for s in 1.5b 0.5b 7b; do dv $s $r mens-prev; dv $s $r mens; done; done > $O/decode.txt
date +%T >> $O/state.txt
vf() { s=$1; r=$2; m=$3; timeout 90 $B/$m bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r $m: /"; }
for r in 1 2; do for s in 1.5b 7b; do vf $s $r mens-prev; vf $s $r mens; done; done > $O/verify.txt
date +%T >> $O/state.txt
cf() { m=$1; timeout 120 $B/$m bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -E "sequences together" | sed "s/^/$m: /"; }
for m in mens-prev mens mens-prev mens; do cf $m; done > $O/concurrency.txt
date +%T >> $O/state.txt
cat $O/decode.txt $O/verify.txt $O/concurrency.txt $O/state.txt

# ---- call 6
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 100 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt

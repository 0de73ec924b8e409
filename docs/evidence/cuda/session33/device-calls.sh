# The four device calls of session 33, each `bash` of the prelude below followed by its body
# (the calls ran them as .device/c13.sh .. c16.sh).
# ---- prelude ----
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
date +%T > $O/state.txt

# ---- call 1 (c13.sh) ----
# 1. the tests with an empty JIT cache (both modules)
CUDA_CACHE_PATH=/tmp/jit-2 MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
date +%T >> $O/state.txt
# 2. a single-sequence run with the driver's JIT cache empty: only the main module is made
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "first run, main module only: %e s" timeout 90 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 64 --reps 1 --paired 0 > $O/first.txt 2>&1
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "second run: %e s" timeout 60 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 64 --reps 1 --paired 0 >> $O/first.txt 2>&1
CUDA_CACHE_PATH=/tmp/jit-1 /usr/bin/time -f "first verify (batch module made): %e s" timeout 90 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 512 >> $O/first.txt 2>&1
date +%T >> $O/state.txt
grep -E "memory plan|first|second|tg|verify" $O/first.txt
export CUDA_CACHE_PATH=/tmp/jit-2
# 3. decode with the staged matvec (O, down) against the plain one, alternating
dv() { s=$1; r=$2; v=$3; shift 3; env "$@" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror|anic" | sed "s/^/$s r$r $v: /"; }
for r in 1 2; do for s in 7b 1.5b 0.5b; do dv $s $r plain X=1; dv $s $r s0 MENS_CUDA_MATVEC_S=0; dv $s $r s4 MENS_CUDA_MATVEC_S=4; done; done > $O/decode.txt
date +%T >> $O/state.txt
MENS_CUDA_MATVEC_S=0 MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b-s0.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b-s0.log | head -5
MENS_CUDA_MATVEC_S=0 MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 60 $B/cuda-test tiny --test-threads=1 > $O/tests-tiny-s0.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests-tiny-s0.log | head -5
date +%T >> $O/state.txt
cat $O/decode.txt $O/state.txt

# ---- call 2 (c14.sh) ----
# the gate/up variants: JIT each first, in parallel
V=("X=1" "MENS_CUDA_DEFINES=-DGLU_RP=2 -DQ8_RP=2" "MENS_CUDA_DEFINES=-DGLU_RP=2 -DGLU_MINB=1 -DQ8_RP=2 -DQ8_MINB=2" "MENS_CUDA_DEFINES=-DGLU_RP=4 -DGLU_MINB=1 -DQ8_RP=4 -DQ8_MINB=2")
N=(base rp2 rp2m1 rp4m1)
for i in 0 1 2 3; do env "${V[$i]}" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "${V[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1 2 3; do vf 7b $r $i; done; done >> $O/verify.txt
for i in 0 1 3; do vf 1.5b 1 $i; done >> $O/verify.txt
date +%T >> $O/state.txt
# 4. the bit tests under each variant
for i in 1 2 3; do env "${V[$i]}" MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 100 $B/cuda-test --test-threads=1 batch > $O/tests-${N[$i]}.log 2>&1; grep -E "test result|FAILED|panicked" $O/tests-${N[$i]}.log | sed "s/^/${N[$i]}: /" | head -5; done
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
cat $O/verify.txt $O/state.txt

# ---- call 3 (c15.sh) ----
V=("X=1" "MENS_CUDA_DEFINES=-DQ8_RP=1" "MENS_CUDA_DEFINES=-DQ8_RP=4 -DQ8_MINB=2" "MENS_CUDA_DEFINES=-DACT_G=8" "MENS_CUDA_DEFINES=-DGLU_RP=1 -DQ8_RP=1")
N=(new q8rp1 q8rp4 actg8 old)
for i in 0 1 2 3 4; do env "${V[$i]}" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 150 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "${V[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1 2 3 4; do vf 7b $r $i; done; done > $O/verify.txt
for s in 1.5b; do for i in 0 4; do vf $s 1 $i; done; done >> $O/verify.txt
date +%T >> $O/state.txt
cf() { i=$1; env "${V[$i]}" timeout 120 $B/mens bench -m /tmp/mens-models/synth-7b.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -vE "^$" | tail -8 | sed "s/^/${N[$i]}: /"; }
for i in 0 4 0 4; do cf $i; done > $O/concurrency.txt
date +%T >> $O/state.txt
cat $O/verify.txt $O/concurrency.txt $O/state.txt

# ---- call 4 (c16.sh) ----
V=("X=1" "MENS_CUDA_DEFINES=-DGLU_RP=4" "MENS_CUDA_DEFINES=-DGLU_RP=4 -DACT_G=2" "MENS_CUDA_DEFINES=-DGLU_MINB=3" "MENS_CUDA_DEFINES=-DGLU_RP=1")
N=(rp2 rp4 rp4g2 rp2m3 rp1)
for i in 0 1 2 3 4; do env "${V[$i]}" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 150 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
vf() { s=$1; r=$2; i=$3; env "${V[$i]}" timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"; }
for r in 1 2; do for i in 0 1 2 3; do vf 7b $r $i; done; done > $O/verify.txt
for s in 1.5b 0.5b; do for i in 0 1; do vf $s 1 $i; done; done >> $O/verify.txt
date +%T >> $O/state.txt
for i in 1 2 3; do env "${V[$i]}" MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 100 $B/cuda-test --test-threads=1 batch > $O/tests-${N[$i]}.log 2>&1; grep -E "test result|FAILED|panicked" $O/tests-${N[$i]}.log | sed "s/^/${N[$i]}: /" | head -5; done
date +%T >> $O/state.txt
cf() { i=$1; env "${V[$i]}" timeout 120 $B/mens bench -m /tmp/mens-models/synth-7b.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -E "sequences together" | sed "s/^/${N[$i]}: /"; }
for i in 0 4 0 4; do cf $i; done > $O/concurrency.txt
for s in 7b 1.5b 0.5b; do timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "tg|rror" | sed "s/^/$s: /"; done > $O/decode.txt
date +%T >> $O/state.txt
cat $O/verify.txt $O/concurrency.txt $O/decode.txt $O/state.txt
rm -f $O/jit-*.txt

# ---- call 5 (c17.sh, whole; mens-prev: the binary of commit b76fbde, carried beside this one) ----
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 0.5b 1.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
date +%T > $O/state.txt
for m in mens mens-prev; do timeout 200 $B/$m bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 150 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5
date +%T >> $O/state.txt
for r in 1 2; do for m in mens-prev mens; do
  timeout 90 $B/$m bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/0.5b r$r $m: /"
  timeout 90 $B/$m bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -E "sequences together|rror" | sed "s/^/0.5b r$r $m: /"
done; done > $O/ab.txt
date +%T >> $O/state.txt
cat $O/ab.txt $O/state.txt

# ---- call 6 (c18.sh, whole; its binary had a MENS_CUDA_NARROW knob setting the Q/K/V, O and down tile, removed after) ----
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
date +%T > $O/state.txt
timeout 200 $B/mens bench -m /tmp/mens-models/synth-1.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1
date +%T >> $O/state.txt
for r in 1 2; do for n in 4 8; do for s in 7b 1.5b; do
  MENS_CUDA_NARROW=$n timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r narrow $n: /"
done; done; done > $O/narrow.txt
date +%T >> $O/state.txt
MENS_CUDA_NARROW=8 MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 100 $B/cuda-test --test-threads=1 batch > $O/tests-narrow8.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests-narrow8.log | head -3
date +%T >> $O/state.txt
cat $O/narrow.txt $O/state.txt

# ---- call 7 (c19.sh, whole: the tests on the final kernels, the batch gate/up with one shared tail) ----
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 0.5b 1.5b; do $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 150 $B/cuda-test --test-threads=1 --nocapture > $O/cuda-tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/cuda-tests.log | head -5
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 40 $B/cuda-test model_file --nocapture > $O/cuda-tests-1.5b.log 2>&1
grep -E "rel L2|argmax|test result" $O/cuda-tests-1.5b.log | head -5

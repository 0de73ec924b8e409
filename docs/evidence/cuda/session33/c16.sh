set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1; done
date +%T > $O/state.txt
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

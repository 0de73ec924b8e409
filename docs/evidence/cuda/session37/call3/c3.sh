set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
for D in "" "-DPDL_NO_PRE" "-DPDL_NO_EARLY -DPDL_NO_TRIGGER"; do MENS_CUDA_DEFINES="$D" timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 8 --reps 1 --paired 0 -q > /dev/null 2>&1; date +%T >> $O/state.txt; done
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file 2>&1 | grep -E "test result|FAILED|panicked|rel L2|argmax" | head -8 | tee $O/tests-model.txt
date +%T >> $O/state.txt
run() { # name, model, env...
  local n=$1 s=$2; shift 2
  env "$@" timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r $n: /"
}
for r in 1 2; do for s in 0.5b 1.5b 7b; do
  run new $s X=1
  run nopre $s MENS_CUDA_DEFINES=-DPDL_NO_PRE
  run old $s "MENS_CUDA_DEFINES=-DPDL_NO_EARLY -DPDL_NO_TRIGGER"
  run old-hg1 $s "MENS_CUDA_DEFINES=-DPDL_NO_EARLY -DPDL_NO_TRIGGER" MENS_CUDA_ATTN_HG=1
done; done | tee $O/decode.txt
date +%T >> $O/state.txt
for s in 7b 1.5b 0.5b; do
  timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s: /"
done | tee $O/verify.txt
date +%T >> $O/state.txt
for s in 7b 0.5b; do
  for o in none qkv_rope attn_decode attn_output glu ffn_down rmsnorm "LM head"; do
    env MENS_CUDA_OMIT="${o/none/}" timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0 \
      --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s without $o: /"
  done; done | tee $O/omit.txt
date +%T >> $O/state.txt
for s in 7b 0.5b; do timeout 120 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 64 --paired 0 --reps 1 --profile > $O/profile-$s.txt 2>&1; done
date +%T >> $O/state.txt

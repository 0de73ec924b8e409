set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test llama-cuda/llama-bench; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$(basename $f); chmod +x $B/$(basename $f); done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-1
date +%T > $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 200 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 60 $B/cuda-test --test-threads=1 --nocapture model_file 2>&1 | grep -E "test result|FAILED|panicked|rel L2|argmax" | head -8 | tee $O/tests-model.txt
MENS_CUDA_STREAM=glu,down MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 90 $B/cuda-test --test-threads=1 gpu_matches_cpu batch_decodes_like batch_verify_rows streamed model_file 2>&1 | grep -E "test result|FAILED|panicked" | sed "s/^/STREAM: /" | tee $O/tests-stream.txt
date +%T >> $O/state.txt
MENS_CUDA_DEFINES=-DSTREAM_D=3 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --depth 0 --gen 8 --reps 1 --paired 0 -q >/dev/null 2>&1
date +%T >> $O/state.txt
b() { l=$1; shift; env "$@" timeout 60 $B/mens bench -m $m --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $l: /"; }
for s in 7b 1.5b 0.5b; do m=/tmp/mens-models/synth-$s.gguf
  for r in 1 2; do
    b base X=1
    b S MENS_CUDA_STREAM=glu,down
    b S3 MENS_CUDA_STREAM=glu,down MENS_CUDA_DEFINES=-DSTREAM_D=3
    b down MENS_CUDA_STREAM=down
    [ $s = 7b ] && b glu3 MENS_CUDA_STREAM=glu MENS_CUDA_DEFINES=-DSTREAM_D=3
    [ $s = 7b ] || b S-gw8 MENS_CUDA_STREAM=glu,down MENS_CUDA_STREAM_GW=8
  done
done | tee $O/decode.txt
date +%T >> $O/state.txt
m=/tmp/mens-models/synth-7b.gguf
for v in "X=1" "MENS_CUDA_STREAM=glu,down"; do echo "== $v"; env $v timeout 60 $B/mens bench -m $m --backend cuda --prompt 16 --steps 64 --reps 1 --paired 0 --profile 2>&1 | grep -E "^\|" | head -30; done > $O/profile-7b.txt
date +%T >> $O/state.txt

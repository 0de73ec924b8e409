# The seven device calls of session 35, as run (each as `bash .device/cN.sh` with .device carried).

# ---- call 1
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done
export CUDA_CACHE_PATH=/tmp/jit-2
(timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 -q > $O/jit.txt 2>&1 || true) &
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O3 -arch=sm_90 scripts/boundary-probe.cu -o /tmp/bp && /tmp/bp | tee $O/boundary-probe.txt
wait
date +%T > $O/state.txt
for s in 0.5b 1.5b; do for r in 1 2; do
  for o in none qkv_rope attn_decode attn_output glu ffn_down "LM head" argmax; do
    env MENS_CUDA_OMIT="${o/none/}" timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0 \
      --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s round $r, without $o: /"
  done; done; done | tee $O/omit.txt
date +%T >> $O/state.txt

# ---- call 2
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
for b in mens mens-prev; do timeout 200 $B/$b bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$b.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file > $O/tests-model-1.5b.log 2>&1
grep -E "test result|FAILED|panicked|rel L2|argmax" $O/tests-model-1.5b.log | head -8
date +%T >> $O/state.txt
for r in 1 2; do for s in 0.5b 1.5b 7b; do for b in mens-prev mens; do
  timeout 60 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r $b: /"
done; done; done | tee $O/decode.txt
date +%T >> $O/state.txt

# ---- call 3
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
N=(prev v0 rd rd2 both); D=("" "" "-DNO_R_ROWDOT" "-DNO_R_ROWDOT2" "-DNO_R_ROWDOT -DNO_R_ROWDOT2"); BIN=(mens-prev mens mens mens mens)
for i in 0 1 2 3 4; do MENS_CUDA_DEFINES="${D[$i]}" timeout 200 $B/${BIN[$i]} bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$i.txt 2>&1 & done; wait
date +%T >> $O/state.txt
for r in 1 2; do for s in 1.5b 7b; do for i in 0 1 2 3 4; do
  MENS_CUDA_DEFINES="${D[$i]}" timeout 60 $B/${BIN[$i]} bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r ${N[$i]}: /"
done; done; done | tee $O/decode.txt
date +%T >> $O/state.txt
for r in 1 2; do for s in 7b 0.5b; do for i in 0 1; do
  timeout 90 $B/${BIN[$i]} bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r ${N[$i]}: /"
done; done; done | tee $O/verify.txt
date +%T >> $O/state.txt

# ---- call 4
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
for b in mens mens-prev; do timeout 200 $B/$b bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$b.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file > $O/tests-model-1.5b.log 2>&1
grep -E "test result|FAILED|panicked|rel L2|argmax" $O/tests-model-1.5b.log | head -8
date +%T >> $O/state.txt
for r in 1 2; do for s in 0.5b 1.5b 7b; do for b in mens-prev mens; do
  timeout 60 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r $b: /"
done; done; done | tee $O/decode.txt
date +%T >> $O/state.txt
for r in 1 2; do for s in 0.5b 1.5b 7b; do for b in mens-prev mens; do
  timeout 90 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r $b: /"
done; done; done > $O/verify.txt
grep -E "verify 8 " $O/verify.txt
for b in mens-prev mens; do timeout 90 $B/$b bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 64 --paired 0 --reps 1 --profile -q > $O/profile-$b.txt 2>&1; done
grep -iE "LM head|attn_output|qkv|glu|down" $O/profile-*.txt | head -20
date +%T >> $O/state.txt

# ---- call 5
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/prev/mens.xz $B/mens-prev; chmod +x $B/mens-prev
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz .device/prev/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
for b in mens mens-prev; do timeout 200 $B/$b bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > $O/jit-$b.txt 2>&1 & done; wait
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file > $O/tests-model-1.5b.log 2>&1
grep -E "test result|FAILED|panicked|rel L2|argmax" $O/tests-model-1.5b.log | head -8
date +%T >> $O/state.txt
for r in 1 2 3; do for s in 0.5b; do for b in mens-prev mens; do
  timeout 60 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r $b: /"
done; done; done | tee $O/decode.txt
date +%T >> $O/state.txt
for r in 1 2 3; do for s in 0.5b; do for b in mens-prev mens; do
  timeout 90 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s r$r $b: /"
done; done; done > $O/verify.txt
grep -E "verify (1|8|16) " $O/verify.txt
for s in 1.5b 7b; do for b in mens-prev mens; do
  timeout 60 $B/$b bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s $b: /"
done; done | tee $O/decode-big.txt
for b in mens-prev mens; do timeout 90 $B/$b bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 64 --paired 0 --reps 1 --profile -q > $O/profile-$b.txt 2>&1; done
grep -iE "LM head|attn_output|qkv|glu|down" $O/profile-*.txt | head -20
date +%T >> $O/state.txt

# ---- call 6 (the final source: committed 84279bb + the 896-column batch glu test)
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file >> $O/tests.log 2>&1
grep -E "test result|FAILED|panicked|rel L2 median|glu_q8_b" $O/tests.log | head -16
date +%T >> $O/state.txt
for r in 1 2; do for s in 0.5b 1.5b; do for w in 8 4 2; do
  MENS_CUDA_GLU_WARPS=$w timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s r$r glu warps $w: /"
done; done; done | tee $O/decode.txt
date +%T >> $O/state.txt
for s in 7b 1.5b 0.5b; do
  timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s: /"
done | tee $O/verify.txt
date +%T >> $O/state.txt

# ---- call 7 (the final source, after the review: Q5_0's unpack and the layouts' finish() shared)
set -u
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
for s in 7b 1.5b 0.5b; do [ -f /tmp/mens-models/synth-$s.gguf ] || $B/mens synth --shape $s -o /tmp/mens-models/synth-$s.gguf >/dev/null 2>&1 & done; wait
export CUDA_CACHE_PATH=/tmp/jit-2
date +%T > $O/state.txt
timeout 200 $B/mens bench -m /tmp/mens-models/synth-0.5b.gguf --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --verify 8 --verify-depth 16 -q > /dev/null 2>&1
date +%T >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
MENS_CUDA_MODEL=/tmp/mens-models/synth-1.5b.gguf timeout 120 $B/cuda-test --test-threads=1 --nocapture model_file >> $O/tests.log 2>&1
grep -E "test result|FAILED|panicked|rel L2 median|glu_q8_b" $O/tests.log | head -16
date +%T >> $O/state.txt
for s in 0.5b 1.5b 7b; do timeout 60 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/$s: /"; done | tee $O/decode.txt
date +%T >> $O/state.txt
for s in 7b 1.5b 0.5b; do
  timeout 90 $B/mens bench -m /tmp/mens-models/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror|anic" | sed "s/^/$s: /"
done | tee $O/verify.txt
date +%T >> $O/state.txt

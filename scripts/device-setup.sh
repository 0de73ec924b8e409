# Sourced (`. scripts/device-setup.sh`) at the start of a command on a GPU machine, from the
# repository root: unpacks the carried CUDA build (.device/*.xz, made by scripts/cuda-build.sh) into
# $BIN, the kernels' PTX (.device/ptx) into NVRTC's cache $MENS_CUDA_CACHE (no compile there), and
# puts the machine's CUDA libraries (cuBLAS, NVRTC: a pip CUDA install or the toolkit) on
# LD_LIBRARY_PATH. Everything is unpacked again on every call (a warm machine keeps /tmp, and a
# rebuilt binary must replace the last one). Sets BIN and M (where `mens synth` files go).
BIN=/tmp/mens-bin
M=/tmp/mens-models
mkdir -p "$BIN" "$M"
for d in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib /usr/local/cuda/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export MENS_CUDA_CACHE=/tmp/mens-cuda-cache
mkdir -p "$MENS_CUDA_CACHE"
unxz_to() {  # FILE.xz DEST (python's lzma: some machines lack xz)
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"
}
for f in .device/*.xz; do
  [ -f "$f" ] || continue
  unxz_to "$f" "$BIN/$(basename "$f" .xz)"
  chmod +x "$BIN/$(basename "$f" .xz)"
done
for f in .device/ptx/*.ptx.xz; do
  [ -f "$f" ] && unxz_to "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"
done

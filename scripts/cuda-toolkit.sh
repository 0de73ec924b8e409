#!/usr/bin/env bash
# cuda-toolkit.sh [DIR]: a CUDA 13.0 toolkit (nvcc, headers, cudart, cuBLAS) from the PyPI wheels, for
# building llama.cpp's CUDA backend on a machine without a GPU (scripts/llamacpp-build.sh --cuda); mens
# itself needs none (NVRTC at run time). Lays out DIR (default /opt/cuda) as CMake expects it, with a
# stub libcuda.so for the link (the real driver library is loaded at run time on the GPU machine).
# 13.0 is the version the H200's driver 580 accepts. Prints DIR.
set -euo pipefail
dir=${1:-/opt/cuda}
venv=${CUDA_VENV:-/opt/cuda-venv}
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "cuda-toolkit[nvcc,crt,cudart,cccl,nvvm,cublas]==13.0.2"
w=$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)
rm -rf "$dir" && mkdir -p "$dir/lib64/stubs"
for d in bin include nvvm; do ln -s "$w/$d" "$dir/$d"; done
for f in "$w"/lib/*; do ln -s "$f" "$dir/lib64/"; done
for l in cudart cublas cublasLt; do ln -s "lib$l.so.13" "$dir/lib64/lib$l.so"; done
# nvcc looks for its libraries beside its own (resolved) folder.
ln -sfn "$dir/lib64" "$w/lib64"
# The driver functions ggml-cuda links against (its VMM pool), each returning "not supported".
cat > "$dir/stub.c" <<'C'
#include <cuda.h>
#define NS return CUDA_ERROR_NOT_SUPPORTED;
CUresult cuDeviceGet(CUdevice *d, int o) { NS }
CUresult cuDeviceGetAttribute(int *p, CUdevice_attribute a, CUdevice d) { NS }
CUresult cuGetErrorString(CUresult e, const char **s) { NS }
CUresult cuMemAddressFree(CUdeviceptr p, size_t s) { NS }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t s, size_t a, CUdeviceptr addr, unsigned long long f) { NS }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t s, const CUmemAllocationProp *p, unsigned long long f) { NS }
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o) { NS }
CUresult cuMemMap(CUdeviceptr p, size_t s, size_t o, CUmemGenericAllocationHandle h, unsigned long long f) { NS }
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { NS }
CUresult cuMemSetAccess(CUdeviceptr p, size_t s, const CUmemAccessDesc *d, size_t c) { NS }
CUresult cuMemUnmap(CUdeviceptr p, size_t s) { NS }
C
cc -shared -fPIC -I"$dir/include" -Wl,-soname,libcuda.so.1 -o "$dir/lib64/stubs/libcuda.so" "$dir/stub.c"
echo "$dir"

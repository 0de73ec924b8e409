#!/usr/bin/env python3
"""Compiles the q8k probe and the staged 8-row probe (probe.cu, stage8.cu appended to the engine's
batch-module sources, as crates/mens/src/cuda/mod.rs joins them, with -DMENS_BATCH_MODULE) to PTX
for sm_90 with NVRTC, here, where no GPU is needed: python3 bench/cuda-q8k/build.py [NVRTC_LIB_DIR] -> bench/cuda-q8k/probe.ptx
"""
import ctypes
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
kdir = os.path.join(root, "crates/mens/src/cuda/kernels")
files = ["common.cuh", "matvec.cu", "attention.cu", "sample.cu", "batch.cu", "mmq.cu"]
src = "".join(open(os.path.join(kdir, f)).read() for f in files)
src += "".join(open(os.path.join(here, f)).read() for f in ("probe.cu", "stage8.cu"))

libdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, ".cache/nvrtc/nvidia/cu13/lib")
# NVRTC opens its builtins library by name at compile time: loaded first, by path, it is found.
ctypes.CDLL(os.path.join(libdir, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
nv = ctypes.CDLL(os.path.join(libdir, "libnvrtc.so.13"))
prog = ctypes.c_void_p()
assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"probe.cu", 0, None, None) == 0
opts = [b"--gpu-architecture=sm_90", b"-std=c++14", b"-DMENS_BATCH_MODULE"]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
nv.nvrtcGetProgramLog(prog, log)
if rc != 0:
    sys.exit("NVRTC failed:\n" + log.value.decode(errors="replace"))
nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
ptx = ctypes.create_string_buffer(n.value)
nv.nvrtcGetPTX(prog, ptx)
out = os.path.join(here, "probe.ptx")
with open(out, "wb") as f:
    f.write(ptx.raw)
print(f"{out}: {n.value} bytes")

#!/usr/bin/env python3
"""Times stage8.cu's staged 8-row kernels against the engine's batch kernels (matmul_q8_1 and
matmul_q8_8 of a GPU layout) on random matrices, through the CUDA driver API by ctypes:
python3 stage8.py probe.ptx TYPE:ROWSxCOLS ...  (TYPE q4kr or q6kr; default the 7B's gate)

Checks first: every activation row through the staged kernel gets the bits the engine's 1-row
kernel gives it (the output poisoned before each run). Then rounds alternating the kernels
(ROUNDS, default 3), each launched 200 times over enough copies of the matrix that L2 holds none
of it, timed with events. NCU=1: each kernel launched once (for ncu), no checks, no timing.
"""
import math
import os
import random
import struct
import sys

# probe.py's driver helpers: importing it reads the same arguments (the PTX path first) and loads
# the module once; its own probe runs only as a script.
import probe as P
from probe import C, U64, I32, Seg, ck, cu, fn, alloc, upload, download, sync

SHAPES = sys.argv[2:] or ["q4kr:18944x3584"]
NCU = os.environ.get("NCU") == "1"
NB = 8
sms = C.c_int()
ck(cu.cuDeviceGetAttribute(C.byref(sms), 16, P.dev), "SM count")  # MULTIPROCESSOR_COUNT
SMS = sms.value
failed = False


def launch(f, grid, block, args, smem=0):
    P.launch(f, grid, block, args, smem)
    if NCU:
        sync()


def probe(shape):
    global failed
    ty, dims = shape.split(":")
    ROWS, COLS = (int(v) for v in dims.split("x"))
    tid = {"q4kr": 112, "q6kr": 114}[ty]
    nsb, nch = COLS // 256, COLS // 32
    ROW_BYTES = 144 * nsb if ty == "q4kr" else (210 * nsb + 15) // 16 * 16
    rng = random.Random(57)
    n = ROWS * ROW_BYTES
    wb = bytearray(b"".join(rng.randbytes(min(1 << 24, n - i)) for i in range(0, n, 1 << 24)))
    for r in range(ROWS):  # small f16 scales (d, and Q4_K's dmin)
        for sb in range(nsb):
            if ty == "q4kr":
                o = r * ROW_BYTES + sb * 144
                wb[o : o + 4] = struct.pack("<ee", rng.uniform(0.001, 0.01), rng.uniform(0.0005, 0.005))
            else:
                o = r * ROW_BYTES + 26 * nch + 2 * sb
                wb[o : o + 2] = struct.pack("<e", rng.uniform(0.0002, 0.002))
    wb = bytes(wb)
    # Activations: NB rows of q8 chunks (int8 values, then each chunk's (d, d * sum)).
    aq, ad = bytearray(), bytearray()
    for _ in range(NB):
        for c in range(nch):
            x = [rng.gauss(0, 1) for _ in range(32)]
            m = max(abs(v) for v in x)
            d = struct.unpack("<f", struct.pack("<f", m / 127))[0]
            q = [max(-127, min(127, round(v / d))) for v in x]
            aq += struct.pack("<32b", *q)
            ad += struct.pack("<ff", d, d * sum(q))
    copies = min(64, max(2, math.ceil(240e6 / len(wb))))
    W = [upload(wb) for _ in range(copies)]
    d_aq, d_ad = upload(bytes(aq)), upload(bytes(ad))
    out = alloc(4 * NB * ROWS)
    smem = NB * ((nch + 31) // 32) * (64 * 16 + 32 * 8)
    f1, f8 = fn(f"matmul_q8_1_{ty}"), fn(f"matmul_q8_8_{ty}")
    fs = {R: fn(f"s8_{ty}_{R}") for R in (2, 4)}
    for f in fs.values():  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        ck(cu.cuFuncSetAttribute(f, 8, I32(smem)), f"{smem} bytes of shared memory")
    none = Seg(0, 0, 0, 0)
    for name, f in [(f"matmul_q8_1_{ty}", f1), (f"matmul_q8_8_{ty}", f8)] + [(f"s8_{ty}_{R}", f) for R, f in fs.items()]:
        regs, local = C.c_int(), C.c_int()
        ck(cu.cuFuncGetAttribute(C.byref(regs), 4, f), "registers")  # NUM_REGS
        ck(cu.cuFuncGetAttribute(C.byref(local), 3, f), "local")  # LOCAL_SIZE_BYTES
        print(f"{name}: {regs.value} registers, {local.value} bytes of local memory a thread")

    def engine(f, wp, b0, nb):
        args = [Seg(wp, ROW_BYTES, tid, ROWS), none, none, I32(COLS), U64(d_aq + b0 * COLS),
                U64(d_ad + 8 * b0 * nch), I32(nb), U64(out + 4 * b0 * ROWS), I32(ROWS), U64(0), U64(0), I32(0)]
        launch(f, (ROWS + 7) // 8, 128, args)

    def staged(R, wp, per_sm, threads):
        args = [U64(wp), U64(ROW_BYTES), I32(ROWS), I32(COLS), U64(d_aq), U64(d_ad), I32(NB), U64(out), I32(ROWS)]
        launch(fs[R], SMS * per_sm, threads, args, smem)

    def floats():
        return struct.unpack(f"<{NB * ROWS}f", download(out, 4 * NB * ROWS))

    def poison():
        ck(cu.cuMemsetD8_v2(U64(out), 0xFF, C.c_size_t(4 * NB * ROWS)), "memset")

    print(f"\n## {ty} {ROWS} x {COLS}: {smem} bytes of shared memory a block, {SMS} SMs")
    fits = [(pb, th) for pb, th in ((1, 512), (2, 256), (2, 512), (3, 256), (4, 256)) if pb * smem <= 227 * 1024]
    variants = [(R, pb, th) for R in (2, 4) for pb, th in fits]
    cases = [("engine dp4a, 1 row (matmul_q8_1)", lambda wp: engine(f1, wp, 0, 1)),
             ("engine dp4a, 8 rows (matmul_q8_8)", lambda wp: engine(f8, wp, 0, NB))]
    cases += [(f"staged, 8 rows, R={R}, {pb} x {th} threads an SM (s8_{ty}_{R})",
               lambda wp, R=R, pb=pb, th=th: staged(R, wp, pb, th)) for R, pb, th in variants]
    if NCU:  # each kernel once, for ncu
        for i, (_, go) in enumerate(cases):
            go(W[i % copies])
        sync()
        return
    poison()
    for b in range(NB):
        engine(f1, W[0], b, 1)
    sync()
    alone = floats()
    bad = sum(1 for v in alone if v != v or v == 0.0)
    print(f"engine 1-row kernel: {bad} of {len(alone)} values NaN or zero")
    # Staged variants: (R, blocks an SM, threads a block); the grid is SMs x blocks an SM.
    for R, pb, th in variants:
        poison()
        staged(R, W[0], pb, th)
        sync()
        diff = sum(1 for a, b in zip(alone, floats()) if struct.pack("<f", a) != struct.pack("<f", b))
        print(f"bits: staged R={R}, {pb} blocks of {th} an SM: {diff} of {NB * ROWS} values differ from the 1-row kernel's")
        if diff or bad:
            failed = True
    poison()
    engine(f8, W[0], 0, NB)
    sync()
    diff = sum(1 for a, b in zip(alone, floats()) if struct.pack("<f", a) != struct.pack("<f", b))
    print(f"bits: engine 8-row tile: {diff} of {NB * ROWS} values differ from the 1-row kernel's")

    P.time_cases(cases, W, len(wb), f"{ty} {ROWS} x {COLS}")
    for p in W + [d_aq, d_ad, out]:
        ck(cu.cuMemFree_v2(U64(p)), "free")


for shape in SHAPES:
    probe(shape)
if failed:
    raise SystemExit("FAILED")

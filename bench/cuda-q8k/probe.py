#!/usr/bin/env python3
"""Times the q8k probe kernels (probe.cu) against the engine's batch kernels on Q4_K and Q6_K
matrices of given shapes (random weights), through the CUDA driver API by ctypes (no packages
needed): python3 probe.py probe.ptx TYPE:ROWSxCOLS ...  (TYPE q4k or q6k, the GGUF layouts, or
q4kr or q6kr, mens's GPU layouts; default q4k:18944x3584, the 7B's gate)

Checks first: the 8-row kernel gives each activation row the single-row kernel's bits, and both
agree with a float64 reference on a few rows. Then, after every kernel has run a while untimed (the
clocks ramp up), rounds alternating (ROUNDS, default 3): each kernel launched 200
times, cycling over enough copies of the matrix that L2 holds none of it, timed with events.
"""
import ctypes as C
import math
import os
import random
import struct
import sys

ptx_path = sys.argv[1]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SHAPES = sys.argv[2:] or ["q4k:18944x3584"]
NB = 8

cu = C.CDLL("libcuda.so.1")


def ck(rc, what):
    if rc != 0:
        s = C.c_char_p()
        cu.cuGetErrorString(rc, C.byref(s))
        raise SystemExit(f"{what}: CUDA error {rc} {s.value}")


ck(cu.cuInit(0), "init")
dev = C.c_int()
ck(cu.cuDeviceGet(C.byref(dev), 0), "device")
ctx = C.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "ctx")
ck(cu.cuCtxSetCurrent(ctx), "ctx current")
mod = C.c_void_p()
ptx = open(ptx_path, "rb").read()
if not ptx.endswith(b"\0"):
    ptx += b"\0"
ck(cu.cuModuleLoadData(C.byref(mod), ptx), "module load")


def fn(name):
    f = C.c_void_p()
    ck(cu.cuModuleGetFunction(C.byref(f), mod, name.encode()), name)
    return f


def alloc(nbytes):
    p = C.c_uint64()
    ck(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(nbytes)), "alloc")
    return p.value


def upload(data: bytes):
    p = alloc(len(data))
    ck(cu.cuMemcpyHtoD_v2(C.c_uint64(p), data, C.c_size_t(len(data))), "upload")
    return p


def download(p, nbytes):
    b = C.create_string_buffer(nbytes)
    ck(cu.cuMemcpyDtoH_v2(b, C.c_uint64(p), C.c_size_t(nbytes)), "download")
    return b.raw


class Seg(C.Structure):
    _fields_ = [("w", C.c_uint64), ("row_bytes", C.c_uint64), ("type", C.c_int), ("rows", C.c_int)]


def launch(f, grid, block, args, smem=0):
    ptrs = (C.c_void_p * len(args))(*[C.cast(C.pointer(a), C.c_void_p) for a in args])
    ck(cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, None, ptrs, None), "launch")


U64, I32 = C.c_uint64, C.c_int


def sync():
    ck(cu.cuCtxSynchronize(), "sync")


ev0, ev1 = C.c_void_p(), C.c_void_p()
ck(cu.cuEventCreate(C.byref(ev0), 0), "event")
ck(cu.cuEventCreate(C.byref(ev1), 0), "event")
elapsed = getattr(cu, "cuEventElapsedTime_v2", None) or cu.cuEventElapsedTime
failed = False


def scale_min(sc, j):
    if j < 4:
        return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)


def dequant_row(ty, wb, r, row_bytes, cols):
    """A weight row's values (the GGUF block formats, as llama.cpp dequantizes them)."""
    v = []
    for sb in range(cols // 256):
        if ty in ("q4k", "q4kr"):
            o = r * row_bytes + sb * 144
            dw, dm = struct.unpack("<ee", wb[o : o + 4])
            sc = wb[o + 4 : o + 16]
            for j in range(8):
                scj, mj = scale_min(sc, j)
                for i in range(32):
                    if ty == "q4k":  # chunks 2p and 2p + 1: the low and high nibbles of 32 bytes
                        nib = (wb[o + 16 + (j // 2) * 32 + i] >> (4 * (j & 1))) & 15
                    else:  # 16 bytes a chunk: values i and 16 + i in byte i's two nibbles
                        nib = (wb[o + 16 + 16 * j + i % 16] >> (4 * (i // 16))) & 15
                    v.append(dw * scj * nib - dm * mj)
        elif ty == "q6kr":
            n = cols // 32
            base = r * row_bytes
            (d,) = struct.unpack("<e", wb[base + 26 * n + 2 * sb : base + 26 * n + 2 * sb + 2])
            for j in range(8):
                c = 8 * sb + j
                for i in range(32):
                    lo = (wb[base + 16 * c + i % 16] >> (4 * (i // 16))) & 15
                    hb = (wb[base + 16 * n + 8 * c + 4 * (i // 16) + i % 4] >> (2 * ((i % 16) // 4))) & 3
                    (scv,) = struct.unpack("<b", wb[base + 24 * n + 2 * c + i // 16 : base + 24 * n + 2 * c + i // 16 + 1])
                    v.append(d * scv * ((lo | (hb << 4)) - 32))
        else:
            o = r * row_bytes + sb * 210
            (d,) = struct.unpack("<e", wb[o + 208 : o + 210])
            sc = struct.unpack("<16b", wb[o + 192 : o + 208])
            out = [0.0] * 256
            for hf in range(2):
                ql, qh = o + 64 * hf, o + 128 + 32 * hf
                for l in range(32):
                    h = wb[qh + l]
                    q1 = ((wb[ql + l] & 0xF) | ((h & 3) << 4)) - 32
                    q2 = ((wb[ql + l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((wb[ql + l] >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((wb[ql + l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32
                    s8 = 8 * hf + l // 16
                    out[128 * hf + l] = d * sc[s8] * q1
                    out[128 * hf + l + 32] = d * sc[s8 + 2] * q2
                    out[128 * hf + l + 64] = d * sc[s8 + 4] * q3
                    out[128 * hf + l + 96] = d * sc[s8 + 6] * q4
            v += out
    return v


def time_cases(cases, W, nbytes, what, rounds=None):
    """Rounds alternating the cases (name, go(weights)), each launched N times cycling over the
    matrix copies W, timed with events after a warm-up; prints a table of µs a launch and GB/s."""
    rounds = rounds or ROUNDS
    N, copies = 200, len(W)
    res = {name: [] for name, _ in cases}
    # The GPU's clocks ramp up under load: every kernel a while first, untimed.
    for _ in range(3):
        for name, go in cases:
            for i in range(N):
                go(W[i % copies])
    sync()
    for _ in range(rounds):
        for name, go in cases:
            for i in range(10):
                go(W[i % copies])
            sync()
            ck(cu.cuEventRecord(ev0, None), "record")
            for i in range(N):
                go(W[i % copies])
            ck(cu.cuEventRecord(ev1, None), "record")
            ck(cu.cuEventSynchronize(ev1), "event sync")
            ms = C.c_float()
            ck(elapsed(C.byref(ms), ev0, ev1), "elapsed")
            res[name].append(1000 * ms.value / N)
    gb = nbytes / 1e9
    print(f"\n{what} ({nbytes / 1e6:.1f} MB), {copies} copies cycled; µs a launch, {rounds} rounds")
    print("| kernel | µs (rounds) | GB/s (best) |\n|---|---|---|")
    for name, _ in cases:
        v = res[name]
        print(f"| {name} | {' / '.join(f'{t:.1f}' for t in v)} | {gb / (max(min(v), 1e-3) * 1e-6):.0f} |")


def probe(shape):
    global failed
    ty, dims = shape.split(":")
    ROWS, COLS = (int(v) for v in dims.split("x"))
    tid = {"q4k": 12, "q6k": 14, "q4kr": 112, "q6kr": 114}[ty]
    nsb = COLS // 256
    ROW_BYTES = {"q4k": 144 * nsb, "q4kr": 144 * nsb, "q6k": 210 * nsb, "q6kr": (210 * nsb + 15) // 16 * 16}[ty]
    rng = random.Random(54)
    # Weights: random bits; d (and Q4_K's dmin) set to small f16 values.
    n = ROWS * ROW_BYTES
    wb = bytearray(b"".join(rng.randbytes(min(1 << 24, n - i)) for i in range(0, n, 1 << 24)))
    for r in range(ROWS):
        for sb in range(nsb):
            if ty in ("q4k", "q4kr"):
                o = r * ROW_BYTES + sb * 144
                wb[o : o + 4] = struct.pack("<ee", rng.uniform(0.001, 0.01), rng.uniform(0.0005, 0.005))
            elif ty == "q6k":
                o = r * ROW_BYTES + sb * 210 + 208
                wb[o : o + 2] = struct.pack("<e", rng.uniform(0.0002, 0.002))
            else:
                o = r * ROW_BYTES + 26 * (COLS // 32) + 2 * sb
                wb[o : o + 2] = struct.pack("<e", rng.uniform(0.0002, 0.002))
    wb = bytes(wb)
    # Activations: NB rows of Gaussian values; both quantizations of the same floats.
    x = [[rng.gauss(0, 1) for _ in range(COLS)] for _ in range(NB)]

    def rnd(v):
        return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)

    def quant(row, blk):
        q, d = [], []
        for i in range(0, COLS, blk):
            m = max(abs(v) for v in row[i : i + blk])
            s = m / 127 if m > 0 else 0.0
            s = struct.unpack("<f", struct.pack("<f", s))[0]
            inv = 1 / s if s else 0.0
            q += [max(-127, min(127, rnd(v * inv))) for v in row[i : i + blk]]
            d.append(s)
        return q, d

    q32 = [quant(r, 32) for r in x]
    q256 = [quant(r, 256) for r in x]
    aq32 = b"".join(struct.pack(f"<{COLS}b", *q) for q, _ in q32)
    ad32 = b"".join(
        struct.pack("<ff", d[i], d[i] * sum(q[32 * i : 32 * i + 32])) for q, d in q32 for i in range(COLS // 32)
    )
    aqk = b"".join(struct.pack(f"<{COLS}b", *q) for q, _ in q256)
    dk = b"".join(struct.pack(f"<{COLS // 256}f", *d) for _, d in q256)
    bs = b"".join(struct.pack(f"<{COLS // 32}i", *[sum(q[i : i + 32]) for i in range(0, COLS, 32)]) for q, _ in q256)

    # Enough copies of the matrix that L2 (50 MB on an H100, 60 on an H200) holds none of a launch's.
    copies = min(64, max(2, math.ceil(240e6 / len(wb))))
    W = [upload(wb) for _ in range(copies)]
    d_aq32, d_ad32, d_aqk, d_dk, d_bs = (upload(b) for b in (aq32, ad32, aqk, dk, bs))
    out = alloc(4 * NB * ROWS)

    f_mvs = {4: fn(f"q8k_matvec_{ty}"), 8: fn(f"q8k_matvec8_{ty}")}
    f_mmas = {4: fn(f"q8k_mma_{ty}"), 8: fn(f"q8k_mma8_{ty}")}
    # Q4_KR also through shared memory (q8k_mmas_q4kr: the same sums and order).
    f_staged = {4: fn("q8k_mmas_q4kr"), 8: fn("q8k_mmas8_q4kr")} if ty == "q4kr" else None
    f_old = {n: fn(f"matmul_q8_{n}_{ty}") for n in (1, 4, 8)}
    f_mq = fn(f"matmul_mq_{ty}") if ty in ("q4k", "q6k") else None

    def run_mv(wp, b, ns=4):
        launch(f_mvs[ns], (ROWS + 3) // 4, 128,
               [U64(wp), U64(ROW_BYTES), I32(ROWS), I32(COLS), U64(d_aqk + b * COLS), U64(d_dk + 4 * b * (COLS // 256)),
                U64(d_bs + 4 * b * (COLS // 32)), U64(out + 4 * b * ROWS)])

    def run_mma(wp, nb, ns=4, staged=False):
        launch((f_staged if staged else f_mmas)[ns], (ROWS + 15) // 16, 32 * ns,
               [U64(wp), U64(ROW_BYTES), I32(ROWS), I32(COLS), U64(d_aqk), U64(d_dk), U64(d_bs), I32(nb), U64(out)])

    def run_old(wp, tile, nb):
        s0, none = Seg(wp, ROW_BYTES, tid, ROWS), Seg(0, 0, 0, 0)
        args = [s0, none, none, I32(COLS), U64(d_aq32), U64(d_ad32), I32(nb), U64(out), I32(ROWS), U64(0), U64(0), I32(0)]
        if tile == "mq":
            tiles = (ROWS + 15) // 16
            launch(f_mq, tiles if tiles <= 1056 else (tiles + 3) // 4, 256, args)
        else:
            launch(f_old[tile], (ROWS + 7) // 8, 128, args)

    def floats(n):
        return struct.unpack(f"<{n}f", download(out, 4 * n))

    # 1. Bits: every activation row through the single-row kernel, then all 8 through the 8-row one
    # (each stream count).
    def bits(ns, staged=False):
        ck(cu.cuMemsetD8_v2(U64(out), 0xFF, C.c_size_t(4 * NB * ROWS)), "memset")
        for b in range(NB):
            run_mv(W[0], b, ns)
        sync()
        alone = floats(NB * ROWS)
        ck(cu.cuMemsetD8_v2(U64(out), 0xFF, C.c_size_t(4 * NB * ROWS)), "memset")
        run_mma(W[0], NB, ns, staged)
        sync()
        together = floats(NB * ROWS)
        diff = sum(1 for a, b in zip(alone, together) if struct.pack("<f", a) != struct.pack("<f", b))
        what = "staged 8-row kernel" if staged else "8-row kernel"
        print(f"bits, {ns} streams: {diff} of {NB * ROWS} values differ between the {what} and the single-row one")
        return diff, together

    print(f"\n## {ty} {ROWS} x {COLS}")
    diff4, together = bits(4)
    diff8, together8 = bits(8)
    diff = diff4 + diff8
    if f_staged:
        diff += bits(4, True)[0] + bits(8, True)[0]

    worst = 0.0
    for r in (0, 1, ROWS // 2, ROWS - 1):
        w = dequant_row(ty, wb, r, ROW_BYTES, COLS)
        for b in (0, NB - 1):
            q, d = q256[b]
            e = sum(w[i] * q[i] * d[i // 256] for i in range(COLS))
            for v in (together, together8):
                worst = max(worst, abs(v[b * ROWS + r] - e) / max(abs(e), 1e-6))
    print(f"reference: worst relative error {worst:.2e} on 8 (row, activation row) pairs, both stream counts")
    if diff or worst > 1e-4:
        print("FAILED")
        failed = True

    # 2. Time: rounds alternating the kernels; µs a launch (events around 200 launches).
    cases = [
        ("engine dp4a, 1 row (matmul_q8_1)", lambda wp: run_old(wp, 1, 1)),
        ("engine dp4a, 4 rows (matmul_q8_4)", lambda wp: run_old(wp, 4, 4)),
        ("engine dp4a, 8 rows as 2 tiles of 4 (matmul_q8_4)", lambda wp: run_old(wp, 4, 8)),
        ("engine dp4a, 8 rows (matmul_q8_8)", lambda wp: run_old(wp, 8, 8)),
        ("engine int8 MMA, 8 rows (matmul_mq)", lambda wp: run_old(wp, "mq", 8)),
    ]
    if f_mq is None:
        cases.pop()
    cases += [
        ("q8k, 1 row, 4 streams (q8k_matvec)", lambda wp: run_mv(wp, 0)),
        ("q8k MMA, 4 rows, 4 warps (q8k_mma)", lambda wp: run_mma(wp, 4)),
        ("q8k MMA, 8 rows, 4 warps (q8k_mma)", lambda wp: run_mma(wp, 8)),
        ("q8k, 1 row, 8 streams (q8k_matvec8)", lambda wp: run_mv(wp, 0, 8)),
        ("q8k MMA, 8 rows, 8 warps (q8k_mma8)", lambda wp: run_mma(wp, 8, 8)),
    ]
    if f_staged:
        cases += [
            ("q8k MMA staged, 8 rows, 4 warps (q8k_mmas)", lambda wp: run_mma(wp, 8, 4, True)),
            ("q8k MMA staged, 8 rows, 8 warps (q8k_mmas8)", lambda wp: run_mma(wp, 8, 8, True)),
        ]
    time_cases(cases, W, len(wb), f"{ty} {ROWS} x {COLS}")
    for p in W + [d_aq32, d_ad32, d_aqk, d_dk, d_bs, out]:
        ck(cu.cuMemFree_v2(U64(p)), "free")


if __name__ == "__main__":  # stage8.py imports the helpers above
    for shape in SHAPES:
        probe(shape)
    if failed:
        raise SystemExit("FAILED")

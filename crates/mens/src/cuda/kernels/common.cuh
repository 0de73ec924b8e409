// mens CUDA kernels, compiled at run time by NVRTC (no toolkit needed to build mens).
// Every kernel has a CPU reference in cuda/reference.rs; tests compare them on random inputs.
//
// Conventions
// - Weights stay in their GGUF block formats; a row of `cols` values is `row_bytes` bytes.
// - Decode activations are quantized to "q8": int8 values in blocks of 32 (aq) with one float2
//   (d, s) per block (ad), d = max|x| / 127 and s = d * sum(q). Dot products use dp4a.
// - f16 values are stored as raw u16 and converted with PTX cvt (no cuda_fp16.h needed).
// - `pos` (tokens already in the cache) lives in device memory so a captured graph stays valid.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30
// Q4_K, Q6_K, Q5_0 and Q8_0 repacked at upload for the GPU (cuda::repack): the same values and
// scales, the bytes of each 32-value chunk contiguous and aligned (not GGUF types; 100 + the GGUF id).
#define T_Q4_KR 112
#define T_Q6_KR 114
#define T_Q5_0R 106
#define T_Q8_0R 108

#define SPLIT 64      // keys per attention split (decode)
#define MAXG 8        // query heads per KV head
#define NEG_INF (-1e30f)

__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ int dp4a(int a, int b, int c) {
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// Programmatic dependent launch (sm_90+; a no-op elsewhere and when a kernel was launched without
// it). The decode graph launches its kernels with it (MENS_CUDA_PDL=0 turns it off): a kernel's
// blocks are placed while the one before it drains, so each kernel must `pdl_wait()` before it
// reads or writes anything an earlier kernel touches, and on every path, so that its end implies
// the end of the kernels before it.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// A block lets the next kernel launch once its loads are done (pdl_trigger() after the dot loops,
// attention's P.V, the norm's sum), and a kernel issues its first weight loads before pdl_wait()
// (PDL_EARLY: weights are never written), so the next kernel's blocks are placed during this
// one's tail and their first loads overlap it. A kernel triggers only after its own pdl_wait(),
// so whatever a kernel reads before waiting was written two or more kernels back and is complete.
// H200 decode, on top of the head-split attention: 0.5B +9%, 1.5B +8%, 7B +2-4%; the trigger
// alone +4-5% on the small models, the early loads alone level (docs/benchmarks.md, session 37;
// a trigger at each kernel's start was 9-10% slower, session 28). -DPDL_NO_TRIGGER,
// -DPDL_NO_EARLY: without them, for measurements.
#ifdef PDL_NO_EARLY
#define PDL_EARLY false
#else
#define PDL_EARLY true
#endif
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900 && !defined(PDL_NO_TRIGGER)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Weight loads of the GPU layouts. Each weight byte is read once a step, so they are marked
// streaming (ld.global.cs: evicted first), which leaves L1 and L2 to the activations that every
// warp reads again: H200 decode +4-5% on the 0.5B, 1.5B and 7B (L1::no_allocate alike, .nc alone
// level; docs/benchmarks.md, session 36). -DWLD=0: plain loads; -DWLD_OP="..." another hint.
#ifndef WLD
#define WLD 1
#endif
#ifndef WLD_OP
#define WLD_OP "ld.global.cs"
#endif
__device__ __forceinline__ int4 ldw4(const void* p) {
#if WLD
  int4 v;
  asm(WLD_OP ".v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#else
  return *(const int4*)p;
#endif
}
__device__ __forceinline__ uint2 ldw2(const void* p) {
#if WLD
  uint2 v;
  asm(WLD_OP ".v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
#else
  return *(const uint2*)p;
#endif
}
__device__ __forceinline__ u32 ldw1(const void* p) {
#if WLD
  u32 v;
  asm(WLD_OP ".u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
#else
  return *(const u32*)p;
#endif
}
__device__ __forceinline__ u16 ldwh(const void* p) {
#if WLD
  u16 v;
  asm(WLD_OP ".u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
#else
  return *(const u16*)p;
#endif
}
// u32 from a 2-byte aligned address (blocks of 18, 22, 34, 210 bytes are only 2-aligned).
__device__ __forceinline__ int ld2(const u8* p) {
  const u16* q = (const u16*)p;
  return (int)((u32)q[0] | ((u32)q[1] << 16));
}
__device__ __forceinline__ int ld4(const u8* p) { return *(const int*)p; }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}
// Deferred norms (MENS_CUDA_NORM_DEFER): the kernel before a norm leaves q8 of x · w (the norm's
// weight, not yet its scale) and each 32-value group's sum of squares of x in np; the matvec after
// it sums the groups (lane l the groups l, l + 32, ... in order, then warp_sum's tree: the same bits
// in every warp, decode or batch) and multiplies each row's dot by rsqrt(mean + eps), which is
// the norm's scale taken out of the sum. One kernel a norm fewer between the layers' matvecs.
// np holds NP_REPS copies of a row's sums, NP_MAX apart (dims up to 4096): each block reads the
// copy np_copy gives it, as one copy read by every warp of a matvec was an L2 hot spot (7B decode
// 550 -> 462 tokens/s, docs/benchmarks.md, session 41).
#define NP_MAX 128
#define NP_REPS 32
__device__ __forceinline__ const float* np_copy(const float* np) {
  return np ? np + (blockIdx.x % NP_REPS) * NP_MAX : np;
}
// Lane l's part of the sum of a copy's n sums: groups l, l + 32, ... in order.
__device__ __forceinline__ float parts_lane(const float* c, int n) {
  int l = threadIdx.x & 31;
  float v[NP_MAX / 32];
#pragma unroll
  for (int k = 0; k < NP_MAX / 32; k++) v[k] = l + 32 * k < n ? c[l + 32 * k] : 0.f;
  float p = 0.f;
#pragma unroll
  for (int k = 0; k < NP_MAX / 32; k++) p += v[k];
  return p;
}
__device__ __forceinline__ float norm_scale(float p, int n, float eps) {
  return rsqrtf(warp_sum(p) / (float)(32 * n) + eps);
}
// A decode matvec's row scale from the n group sums of its block's copy (every warp the same bits).
__device__ __forceinline__ float deferred_scale(const float* np, int n, float eps) {
  return norm_scale(parts_lane(np_copy(np), n), n, eps);
}
// The lines of n floats at p into L1, a line a lane (no registers held; for a read at the end).
__device__ __forceinline__ void prefetch_l1(const float* p, int n) {
  int l = threadIdx.x & 31;
  if (p && l * 32 < n) asm volatile("prefetch.global.L1 [%0];" ::"l"(p + l * 32));
}
// Signed bytes v - 32 for bytes v in 0..63, without borrows between bytes.
__device__ __forceinline__ int sub32(int v) {
  u32 n = ~(u32)v & 0x20202020u;
  return (int)(((u32)v ^ 0x20202020u) | (n << 1) | (n << 2));
}
// Q4_K/Q5_K: the 6-bit scale and min of sub-block `sub` from the block header h (d, dmin,
// scales[12] as four words; no byte addressing, which would put the header in local memory),
// chosen without a branch: the lanes of a warp hold different sub-blocks, and a divergent
// branch here kept the next chunk's loads waiting.
__device__ __forceinline__ void q4k_scale_min(int4 h, int sub, int* sc, int* m) {
  int sh = 8 * (sub & 3);
  u32 y = (u32)h.y >> sh, z = (u32)h.z >> sh, w = (u32)h.w >> sh;
  bool lo = sub < 4;
  *sc = lo ? (int)(y & 63) : (int)((w & 0xF) | (((y >> 6) & 3) << 4));
  *m = lo ? (int)(z & 63) : (int)(((w >> 4) & 0xF) | (((z >> 6) & 3) << 4));
}
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}


// KV cache rows. f16: kv_dim values. q8_0 / q4_0 (`-ctk/-ctv`): ggml's blocks of 32 with ggml's
// rounding, laid out for aligned loads: the row's quants first (q4_0: ggml's nibble order within
// a block, values i and i + 16 in byte i), then its f16 block scales, padded to 16 bytes.
// Dequantized as ggml does: d * q (q8_0), d * (nibble - 8) (q4_0).
__device__ __forceinline__ int kv_row_bytes(int t, int kvd) {
  if (t == T_F16) return 2 * kvd;
  int q = t == T_Q8_0 ? kvd : kvd / 2;
  return (q + kvd / 16 + 15) & ~15;
}
// Row `pos` of a cache whose rows are rb bytes: contiguous from `base` (pt null), or in a paged
// pool (pt: the sequence's page table; page pt[pos / SPLIT] holds rows pos - pos % SPLIT.., its
// layer's rows at `base` within each page, pages page_bytes apart).
// RoPE's rotation of the pair (x0, x1) by the angle of cosine c and sine s, each product rounded
// before the sum. Written `x0 * c - x1 * s`, the compiler fused a product into the sum one way in
// the session's rope_store and another in the batch's rope_store_b, so about 1 in 5000 of Qwen3's
// K values parted in the f16 cache between a slot decoding alone and in a batch (session 51,
// rope_store_b_gives_rope_stores_bits). Every RoPE kernel rotates through it.
__device__ __forceinline__ float2 rope_rot(float x0, float x1, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
}
__device__ __forceinline__ const u8* kv_at(const u8* base, const int* pt, u64 page_bytes, int pos, int rb) {
  if (!pt) return base + (u64)pos * rb;
  return base + (u64)pt[pos / SPLIT] * page_bytes + (u64)(pos % SPLIT) * rb;
}
__device__ __forceinline__ float kv_scale(int t, const u8* row, int kvd, int d) {
  return h2f(*(const u16*)(row + (t == T_Q8_0 ? kvd : kvd / 2) + 2 * (d >> 5)));
}
__device__ __forceinline__ float sbyte(u32 w, int k) { return (float)((int)(w << (24 - 8 * k)) >> 24); }
// Values d..d+3 (d a multiple of 4) of a cache row.
template <int T>
__device__ __forceinline__ float4 kv_get4(const u8* row, int kvd, int d) {
  if (T == T_F16) {
    uint2 u = *(const uint2*)(row + 2 * d);
    return make_float4(h2f(u.x & 0xffff), h2f(u.x >> 16), h2f(u.y & 0xffff), h2f(u.y >> 16));
  } else if (T == T_Q8_0) {
    u32 u = *(const u32*)(row + d);
    float s = kv_scale(T, row, kvd, d);
    return make_float4(s * sbyte(u, 0), s * sbyte(u, 1), s * sbyte(u, 2), s * sbyte(u, 3));
  } else {
    int i = d & 31, sh = i >= 16 ? 4 : 0;
    u32 u = *(const u32*)(row + (d >> 5) * 16 + (i & 15)) >> sh;
    float s = kv_scale(T, row, kvd, d);
    return make_float4(s * (float)((int)(u & 15) - 8), s * (float)((int)((u >> 8) & 15) - 8),
                       s * (float)((int)((u >> 16) & 15) - 8), s * (float)((int)((u >> 24) & 15) - 8));
  }
}
// The normalised 32-point Walsh-Hadamard transform across a warp (lane i holds value i of a
// block): the butterflies of kernels/kv.rs::hadamard32 in the same order, so the bits agree. Its
// own inverse. A quantized cache stores its blocks rotated (one large value spread over the
// block); attention rotates Q the same way and its output back.
__device__ __forceinline__ float hadamard32(float x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    float y = __shfl_xor_sync(0xffffffff, x, o);
    x = (lane & o) ? y - x : x + y;
  }
  return x * 0.17677669529663687f;
}
// One warp stores block j (values 32 j .. 32 j + 31) of a quantized cache row from lane's value
// x, rotated (hadamard32), with ggml's rounding: q8_0 d = max|x| / 127, q = rint(x / d); q4_0
// d = -(the value of largest magnitude, the first on ties) / 8, q = min(15, trunc(x / d + 8.5)).
template <int T>
__device__ __forceinline__ void kv_store_block(float x, u8* row, int kvd, int j, int lane) {
  x = hadamard32(x, lane);
  if (T == T_Q8_0) {
    float amax = warp_max(fabsf(x));
    float id = amax != 0.f ? 127.f / amax : 0.f;
    row[j * 32 + lane] = (u8)(i8)__float2int_rn(x * id);
    if (lane == 0) *(u16*)(row + kvd + 2 * j) = f2h(amax / 127.f);
  } else {
    float a = fabsf(x);
    int at = lane;
    for (int o = 16; o > 0; o >>= 1) {
      float a2 = __shfl_xor_sync(0xffffffff, a, o);
      int at2 = __shfl_xor_sync(0xffffffff, at, o);
      if (a2 > a || (a2 == a && at2 < at)) {
        a = a2;
        at = at2;
      }
    }
    float d = __shfl_sync(0xffffffff, x, at) / -8.f;
    float id = d != 0.f ? 1.f / d : 0.f;
    int q = min(15, (int)__fadd_rn(__fmul_rn(x, id), 8.5f));
    int hi = __shfl_down_sync(0xffffffff, q, 16);
    if (lane < 16) row[j * 16 + lane] = (u8)(q | (hi << 4));
    if (lane == 0) *(u16*)(row + kvd / 2 + 2 * j) = f2h(d);
  }
}

// Greedy's order on (value, index) pairs: the larger value, on ties the lower index (the first
// maximum). A total order, so any reduction tree gives the same pair.
__device__ __forceinline__ bool am_first(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }
__device__ __forceinline__ void am_warp(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    float v2 = __shfl_xor_sync(0xffffffff, v, o);
    int i2 = __shfl_xor_sync(0xffffffff, idx, o);
    if (am_first(v2, i2, v, idx)) { v = v2; idx = i2; }
  }
}
// The first maximum of x[0..n) over this block's share of the grid (every gridDim.x * blockDim.x-th
// value from its thread's), in warp 0 (all its lanes). Four loads in flight a thread: the logits
// of a 152k vocabulary are 4-5 a thread at 32 blocks of 1024.
__device__ __forceinline__ void am_block(const float* x, int n, float& v, int& idx, float* bv, int* bi) {
  v = NEG_INF * 10.f;
  idx = 0x7fffffff;
  int stride = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    float y0 = x[i], y1 = x[i + stride], y2 = x[i + 2 * stride], y3 = x[i + 3 * stride];
    if (y0 > v) { v = y0; idx = i; }
    if (y1 > v) { v = y1; idx = i + stride; }
    if (y2 > v) { v = y2; idx = i + 2 * stride; }
    if (y3 > v) { v = y3; idx = i + 3 * stride; }
  }
  for (; i < n; i += stride) {
    float y = x[i];
    if (y > v) { v = y; idx = i; }
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  am_warp(v, idx);
  if (lane == 0) { bv[w] = v; bi[w] = idx; }
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? bv[lane] : NEG_INF * 10.f;
    idx = lane < nw ? bi[lane] : 0x7fffffff;
    am_warp(v, idx);
  }
}
// The first maximum of `count` partial pairs (value, index as float bits), read from L2 by warp 0,
// a pair a lane at a time; the result in every lane of warp 0.
__device__ __forceinline__ void am_partials(const float2* p, int count, float& v, int& idx) {
  v = NEG_INF * 10.f;
  idx = 0x7fffffff;
  for (int k = threadIdx.x & 31; k < count; k += 32) {
    float2 c = __ldcg(&p[k]);
    if (am_first(c.x, __float_as_int(c.y), v, idx)) { v = c.x; idx = __float_as_int(c.y); }
  }
  am_warp(v, idx);
}

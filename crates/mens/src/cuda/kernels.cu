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
// Signed bytes v - 32 for bytes v in 0..63, without borrows between bytes.
__device__ __forceinline__ int sub32(int v) {
  u32 n = ~(u32)v & 0x20202020u;
  return (int)(((u32)v ^ 0x20202020u) | (n << 1) | (n << 2));
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

// ---------------------------------------------------------------------------------------------
// Dot product of the c-th 32-value chunk of a weight row with 32 q8 activations (aq, d8, s8).

template <int T>
__device__ __forceinline__ float dot32(const u8* row, int c, const int* a, float d8, float s8);

template <>
__device__ __forceinline__ float dot32<T_Q8_0>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + c * 34;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) s = dp4a(ld2(b + 2 + 4 * i), a[i], s);
  return h2f(*(const u16*)b) * d8 * (float)s;
}
template <>
__device__ __forceinline__ float dot32<T_Q4_0>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + c * 18;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld2(b + 2 + 4 * i);
    s = dp4a(w & 0x0F0F0F0F, a[i], s);
    s = dp4a((w >> 4) & 0x0F0F0F0F, a[4 + i], s);
  }
  return h2f(*(const u16*)b) * (d8 * (float)s - 8.f * s8);
}
template <>
__device__ __forceinline__ float dot32<T_Q4_1>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + c * 20;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld4(b + 4 + 4 * i);
    s = dp4a(w & 0x0F0F0F0F, a[i], s);
    s = dp4a((w >> 4) & 0x0F0F0F0F, a[4 + i], s);
  }
  return h2f(*(const u16*)b) * d8 * (float)s + h2f(*(const u16*)(b + 2)) * s8;
}
__device__ __forceinline__ int spread4(u32 h) {  // 4 bits -> bit 4 of each byte
  return (int)(((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25));
}
template <>
__device__ __forceinline__ float dot32<T_Q5_0>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + c * 22;
  u32 qh = (u32)ld2(b + 2);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld2(b + 6 + 4 * i);
    s = dp4a((w & 0x0F0F0F0F) | spread4(qh >> (4 * i)), a[i], s);
    s = dp4a(((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i)), a[4 + i], s);
  }
  return h2f(*(const u16*)b) * (d8 * (float)s - 16.f * s8);
}
template <>
__device__ __forceinline__ float dot32<T_Q5_1>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + c * 24;
  u32 qh = (u32)ld4(b + 4);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld4(b + 8 + 4 * i);
    s = dp4a((w & 0x0F0F0F0F) | spread4(qh >> (4 * i)), a[i], s);
    s = dp4a(((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i)), a[4 + i], s);
  }
  return h2f(*(const u16*)b) * d8 * (float)s + h2f(*(const u16*)(b + 2)) * s8;
}
template <>
__device__ __forceinline__ float dot32<T_Q4_K>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + (c >> 3) * 144;  // blocks are 16-byte aligned (144 = 9 * 16)
  int sub = c & 7;
  const int4* q4 = (const int4*)(b + 16 + (sub >> 1) * 32);
  int4 h = *(const int4*)b;  // d, dmin, scales[12]
  int4 x0 = q4[0], x1 = q4[1];
  int qs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  int shift = (sub & 1) * 4;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) s = dp4a((qs[i] >> shift) & 0x0F0F0F0F, a[i], s);
  // 6-bit scale and min of sub-block `sub` from the header words (no byte addressing, which
  // would put the header in local memory).
  int sh = 8 * (sub & 3);
  u32 y = (u32)h.y >> sh, z = (u32)h.z >> sh, w = (u32)h.w >> sh;
  int sc, m;
  if (sub < 4) {
    sc = y & 63;
    m = z & 63;
  } else {
    sc = (w & 0xF) | (((y >> 6) & 3) << 4);
    m = ((w >> 4) & 0xF) | (((z >> 6) & 3) << 4);
  }
  return h2f((u16)(h.x & 0xffff)) * (float)sc * d8 * (float)s - h2f((u16)((u32)h.x >> 16)) * (float)m * s8;
}
template <>
__device__ __forceinline__ float dot32<T_Q5_K>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + (c >> 3) * 176;
  int sub = c & 7;
  const int* qh = (const int*)(b + 16);
  const int* qs = (const int*)(b + 48 + (sub >> 1) * 32);
  int shift = (sub & 1) * 4;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++)
    s = dp4a(((qs[i] >> shift) & 0x0F0F0F0F) | ((((u32)qh[i] >> sub) & 0x01010101u) << 4), a[i], s);
  int sc, m;
  scale_min_k4(sub, b + 4, &sc, &m);
  return h2f(*(const u16*)b) * (float)sc * d8 * (float)s - h2f(*(const u16*)(b + 2)) * (float)m * s8;
}
// 8 consecutive u32 from a 2-byte aligned address: 9 aligned loads and funnel shifts instead of
// 16 two-byte loads (Q6_K blocks are 210 bytes, so every other one is only 2-byte aligned).
__device__ __forceinline__ void ld8_a2(const u8* p, int* out) {
  const u32* w = (const u32*)((u64)p & ~(u64)3);
  u32 sh = ((u32)(u64)p & 3) * 8;
  u32 x[9];
#pragma unroll
  for (int i = 0; i < 9; i++) x[i] = w[i];
#pragma unroll
  for (int i = 0; i < 8; i++) out[i] = (int)__funnelshift_r(x[i], x[i + 1], sh);
}
template <>
__device__ __forceinline__ float dot32<T_Q6_K>(const u8* row, int c, const int* a, float d8, float s8) {
  const u8* b = row + (c >> 3) * 210;
  int sub = c & 7, n = sub >> 2, g = sub & 3;
  const u8* ql = b + n * 64 + (g & 1) * 32;
  const u8* qh = b + 128 + n * 32;
  const i8* sc = (const i8*)(b + 192) + n * 8 + 2 * g;
  int lsh = (g >> 1) * 4, hsh = 2 * g;
  int l[8], h[8];
  ld8_a2(ql, l);
  ld8_a2(qh, h);
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int v = ((l[i] >> lsh) & 0x0F0F0F0F) | (((h[i] >> hsh) & 0x03030303) << 4);
    s0 = dp4a(sub32(v), a[i], s0);
  }
#pragma unroll
  for (int i = 4; i < 8; i++) {
    int v = ((l[i] >> lsh) & 0x0F0F0F0F) | (((h[i] >> hsh) & 0x03030303) << 4);
    s1 = dp4a(sub32(v), a[i], s1);
  }
  return h2f(*(const u16*)(b + 208)) * d8 * (float)(sc[0] * s0 + sc[1] * s1);
}
__device__ __forceinline__ float a8(const int* a, int i) { return (float)((const i8*)a)[i]; }
template <>
__device__ __forceinline__ float dot32<T_F16>(const u8* row, int c, const int* a, float d8, float s8) {
  const u16* w = (const u16*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += h2f(w[i]) * a8(a, i);
  return s * d8;
}
template <>
__device__ __forceinline__ float dot32<T_BF16>(const u8* row, int c, const int* a, float d8, float s8) {
  const u16* w = (const u16*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += __int_as_float((int)((u32)w[i] << 16)) * a8(a, i);
  return s * d8;
}
template <>
__device__ __forceinline__ float dot32<T_F32>(const u8* row, int c, const int* a, float d8, float s8) {
  const float* w = (const float*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += w[i] * a8(a, i);
  return s * d8;
}

// Dot of one row with the whole q8 activation vector, by one warp.
template <int T>
__device__ float row_dot_t(const u8* __restrict__ row, int nchunks, const i8* __restrict__ aq,
                           const float2* __restrict__ ad) {
  float acc = 0.f;
  int lane = threadIdx.x & 31;
#pragma unroll 4
  for (int c = lane; c < nchunks; c += 32) {
    int a[8];
    const int4* ap = (const int4*)(aq + c * 32);
    int4 a0 = ap[0], a1 = ap[1];
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    float2 ds = ad[c];
    acc += dot32<T>(row, c, a, ds.x, ds.y);
  }
  return warp_sum(acc);
}
__device__ float row_dot(int type, const u8* row, int nchunks, const i8* aq, const float2* ad) {
  switch (type) {
    case T_Q4_K: return row_dot_t<T_Q4_K>(row, nchunks, aq, ad);
    case T_Q6_K: return row_dot_t<T_Q6_K>(row, nchunks, aq, ad);
    case T_Q5_0: return row_dot_t<T_Q5_0>(row, nchunks, aq, ad);
    case T_Q8_0: return row_dot_t<T_Q8_0>(row, nchunks, aq, ad);
    case T_Q4_0: return row_dot_t<T_Q4_0>(row, nchunks, aq, ad);
    case T_Q4_1: return row_dot_t<T_Q4_1>(row, nchunks, aq, ad);
    case T_Q5_1: return row_dot_t<T_Q5_1>(row, nchunks, aq, ad);
    case T_Q5_K: return row_dot_t<T_Q5_K>(row, nchunks, aq, ad);
    case T_F16: return row_dot_t<T_F16>(row, nchunks, aq, ad);
    case T_BF16: return row_dot_t<T_BF16>(row, nchunks, aq, ad);
    default: return row_dot_t<T_F32>(row, nchunks, aq, ad);
  }
}

struct Seg {
  const u8* w;
  u64 row_bytes;
  int type;
  int rows;
};

// out[r] (+)= W[r] . a (+ bias[r]) for the rows of up to three matrices stacked (Q, K, V).
// One warp per row, 4 warps per block. mode 0 stores, 1 adds (the residual).
extern "C" __global__ void matvec(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad,
                                  float* out, const float* bias, int mode) {
  int r = blockIdx.x * 4 + (threadIdx.x >> 5);
  int total = s0.rows + s1.rows + s2.rows;
  if (r >= total) return;
  Seg s = s0;
  int rr = r;
  if (rr >= s0.rows) {
    rr -= s0.rows;
    s = s1;
    if (rr >= s1.rows) {
      rr -= s1.rows;
      s = s2;
    }
  }
  float v = row_dot(s.type, s.w + (u64)rr * s.row_bytes, cols / 32, aq, ad);
  if ((threadIdx.x & 31) == 0) {
    if (bias) v += bias[r];
    out[r] = mode ? out[r] + v : v;
  }
}

// Quantize 32 floats held one per lane into a q8 block (by one warp).
__device__ __forceinline__ void quant_lane(float v, i8* qs, float2* ds) {
  float amax = warp_max(fabsf(v));
  float d = amax / 127.f;
  int q = d > 0.f ? __float2int_rn(v / d) : 0;
  qs[threadIdx.x & 31] = (i8)q;
  float sq = warp_sum((float)q);
  if ((threadIdx.x & 31) == 0) *ds = make_float2(d, d * sq);
}

// Two rows of one type against the same activations, loads interleaved (gate and up).
template <int T>
__device__ float2 row_dot2_t(const u8* __restrict__ ra, const u8* __restrict__ rb, int nchunks,
                             const i8* __restrict__ aq, const float2* __restrict__ ad) {
  float x = 0.f, y = 0.f;
  int lane = threadIdx.x & 31;
#pragma unroll 2
  for (int c = lane; c < nchunks; c += 32) {
    int a[8];
    const int4* ap = (const int4*)(aq + c * 32);
    int4 a0 = ap[0], a1 = ap[1];
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    float2 ds = ad[c];
    x += dot32<T>(ra, c, a, ds.x, ds.y);
    y += dot32<T>(rb, c, a, ds.x, ds.y);
  }
  return make_float2(warp_sum(x), warp_sum(y));
}
__device__ float2 row_dot2(int ta, const u8* ra, int tb, const u8* rb, int nchunks, const i8* aq, const float2* ad) {
  if (ta == tb) {
    switch (ta) {
      case T_Q4_K: return row_dot2_t<T_Q4_K>(ra, rb, nchunks, aq, ad);
      case T_Q6_K: return row_dot2_t<T_Q6_K>(ra, rb, nchunks, aq, ad);
      case T_Q5_0: return row_dot2_t<T_Q5_0>(ra, rb, nchunks, aq, ad);
      case T_Q8_0: return row_dot2_t<T_Q8_0>(ra, rb, nchunks, aq, ad);
      default: break;
    }
  }
  return make_float2(row_dot(ta, ra, nchunks, aq, ad), row_dot(tb, rb, nchunks, aq, ad));
}

// h = silu(gate . a) * (up . a), quantized to q8: a block of 32 warps makes 32 rows (one q8
// block), one gate row and one up row per warp.
extern "C" __global__ void __launch_bounds__(1024) matvec_glu_q8(Seg gate, Seg up, int cols, const i8* aq, const float2* ad,
                                         i8* hq, float2* hd) {
  __shared__ float h[32];
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r = blockIdx.x * 32 + w;
  float2 gu = make_float2(0.f, 0.f);
  if (r < gate.rows)
    gu = row_dot2(gate.type, gate.w + (u64)r * gate.row_bytes, up.type, up.w + (u64)r * up.row_bytes,
                  cols / 32, aq, ad);
  if (lane == 0) h[w] = gu.x / (1.f + expf(-gu.x)) * gu.y;
  __syncthreads();
  if (w == 0) quant_lane(h[lane], hq + blockIdx.x * 32, hd + blockIdx.x);
}

// Decode Q/K/V: the three matrices stacked, bias, RoPE, K and V into the f16 cache at *pos, Q
// (rounded to f16, as llama.cpp's flash attention reads it) into qkv. One warp per pair of rows
// that RoPE rotates together (NeoX: i and i + hd/2; normal: 2i and 2i + 1); V rows are paired
// the same way, unrotated.
extern "C" __global__ void qkv_rope(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad,
                                    const float* bias, const float* cosv, const float* sinv, const int* pos,
                                    int n_head, int n_kv_head, int hd, int neox, float* qkv, u16* kc, u16* vc) {
  int half = hd / 2;
  int p = blockIdx.x * 4 + (threadIdx.x >> 5);
  int heads = n_head + 2 * n_kv_head;
  if (p >= heads * half) return;
  int h = p / half, k = p % half;
  int ra = h * hd + (neox ? k : 2 * k), rb = h * hd + (neox ? k + half : 2 * k + 1);
  Seg s = s0;
  int base = 0;
  if (ra >= s0.rows) {
    base = s0.rows;
    s = s1;
    if (ra >= s0.rows + s1.rows) {
      base = s0.rows + s1.rows;
      s = s2;
    }
  }
  float2 v = row_dot2(s.type, s.w + (u64)(ra - base) * s.row_bytes, s.type, s.w + (u64)(rb - base) * s.row_bytes,
                      cols / 32, aq, ad);
  if ((threadIdx.x & 31) != 0) return;
  float x0 = v.x, x1 = v.y;
  if (bias) {
    x0 += bias[ra];
    x1 += bias[rb];
  }
  int ps = *pos, kvd = n_kv_head * hd;
  if (h < n_head + n_kv_head) {
    float c = cosv[(u64)ps * half + k], sn = sinv[(u64)ps * half + k];
    float y0 = x0 * c - x1 * sn, y1 = x0 * sn + x1 * c;
    if (h < n_head) {
      qkv[ra] = h2f(f2h(y0));
      qkv[rb] = h2f(f2h(y1));
    } else {
      int o = ps * kvd + (h - n_head) * hd;
      kc[o + ra - h * hd] = f2h(y0);
      kc[o + rb - h * hd] = f2h(y1);
    }
  } else {
    int o = ps * kvd + (h - n_head - n_kv_head) * hd;
    vc[o + ra - h * hd] = f2h(x0);
    vc[o + rb - h * hd] = f2h(x1);
  }
}

// x (one row per block, dim a multiple of 32) -> rmsnorm(x) * w, quantized to q8.
extern "C" __global__ void rmsnorm_q8(const float* x, const float* w, float eps, int dim, i8* aq, float2* ad) {
  __shared__ float red[32];
  const float* xr = x + (u64)blockIdx.x * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  float scale = rsqrtf(ss / dim + eps);
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int b = threadIdx.x >> 5; b < dim / 32; b += nw) {
    int i = b * 32 + lane;
    quant_lane(xr[i] * scale * w[i], aq + (u64)blockIdx.x * dim + b * 32, ad + (u64)blockIdx.x * (dim / 32) + b);
  }
}

// Batched norm for prefill: out16[t] = rmsnorm(x[t] (+= delta[t])) * w, in f16 for cuBLAS.
extern "C" __global__ void add_rmsnorm_f16(float* x, const float* delta, const float* w, float eps, int dim, u16* out) {
  __shared__ float red[32];
  float* xr = x + (u64)blockIdx.x * dim;
  const float* dr = delta ? delta + (u64)blockIdx.x * dim : 0;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr) {
      v += dr[i];
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, red);
  float scale = rsqrtf(ss / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(u64)blockIdx.x * dim + i] = f2h(xr[i] * scale * w[i]);
}

// Dequantize the c-th 32-value chunk of a row into 32 floats.
template <int T>
__device__ void deq32(const u8* row, int c, float* y);
template <>
__device__ void deq32<T_Q8_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 34;
  float d = h2f(*(const u16*)b);
  for (int i = 0; i < 32; i++) y[i] = d * (float)(i8)b[2 + i];
}
template <>
__device__ void deq32<T_Q4_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 18;
  float d = h2f(*(const u16*)b);
  for (int i = 0; i < 16; i++) {
    y[i] = d * (float)((b[2 + i] & 0xF) - 8);
    y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
  }
}
template <>
__device__ void deq32<T_Q4_1>(const u8* row, int c, float* y) {
  const u8* b = row + c * 20;
  float d = h2f(*(const u16*)b), m = h2f(*(const u16*)(b + 2));
  for (int i = 0; i < 16; i++) {
    y[i] = d * (float)(b[4 + i] & 0xF) + m;
    y[i + 16] = d * (float)(b[4 + i] >> 4) + m;
  }
}
template <>
__device__ void deq32<T_Q5_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 22;
  float d = h2f(*(const u16*)b);
  u32 qh = (u32)ld2(b + 2);
  for (int i = 0; i < 16; i++) {
    int h0 = (int)((qh >> i) & 1), h1 = (int)((qh >> (i + 16)) & 1);
    y[i] = d * (float)(((b[6 + i] & 0xF) | (h0 << 4)) - 16);
    y[i + 16] = d * (float)(((b[6 + i] >> 4) | (h1 << 4)) - 16);
  }
}
template <>
__device__ void deq32<T_Q5_1>(const u8* row, int c, float* y) {
  const u8* b = row + c * 24;
  float d = h2f(*(const u16*)b), m = h2f(*(const u16*)(b + 2));
  u32 qh = (u32)ld4(b + 4);
  for (int i = 0; i < 16; i++) {
    int h0 = (int)((qh >> i) & 1), h1 = (int)((qh >> (i + 16)) & 1);
    y[i] = d * (float)((b[8 + i] & 0xF) | (h0 << 4)) + m;
    y[i + 16] = d * (float)((b[8 + i] >> 4) | (h1 << 4)) + m;
  }
}
template <>
__device__ void deq32<T_Q4_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 144;
  int sub = c & 7, sc, m;
  scale_min_k4(sub, b + 4, &sc, &m);
  float d = h2f(*(const u16*)b) * sc, mn = h2f(*(const u16*)(b + 2)) * m;
  const u8* qs = b + 16 + (sub >> 1) * 32;
  int shift = (sub & 1) * 4;
  for (int i = 0; i < 32; i++) y[i] = d * (float)((qs[i] >> shift) & 0xF) - mn;
}
template <>
__device__ void deq32<T_Q5_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 176;
  int sub = c & 7, sc, m;
  scale_min_k4(sub, b + 4, &sc, &m);
  float d = h2f(*(const u16*)b) * sc, mn = h2f(*(const u16*)(b + 2)) * m;
  const u8* qh = b + 16;
  const u8* qs = b + 48 + (sub >> 1) * 32;
  int shift = (sub & 1) * 4;
  for (int i = 0; i < 32; i++) y[i] = d * (float)(((qs[i] >> shift) & 0xF) | (((qh[i] >> sub) & 1) << 4)) - mn;
}
template <>
__device__ void deq32<T_Q6_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 210;
  int sub = c & 7, n = sub >> 2, g = sub & 3;
  const u8* ql = b + n * 64 + (g & 1) * 32;
  const u8* qh = b + 128 + n * 32;
  const i8* sc = (const i8*)(b + 192) + n * 8 + 2 * g;
  float d = h2f(*(const u16*)(b + 208));
  int lsh = (g >> 1) * 4, hsh = 2 * g;
  for (int i = 0; i < 32; i++) {
    int q = (((ql[i] >> lsh) & 0xF) | (((qh[i] >> hsh) & 3) << 4)) - 32;
    y[i] = d * (float)sc[i >> 4] * (float)q;
  }
}
template <>
__device__ void deq32<T_F16>(const u8* row, int c, float* y) {
  const u16* w = (const u16*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = h2f(w[i]);
}
template <>
__device__ void deq32<T_BF16>(const u8* row, int c, float* y) {
  const u16* w = (const u16*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = __int_as_float((int)((u32)w[i] << 16));
}
template <>
__device__ void deq32<T_F32>(const u8* row, int c, float* y) {
  const float* w = (const float*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = w[i];
}
__device__ void deq(int type, const u8* row, int c, float* y) {
  switch (type) {
    case T_Q4_K: deq32<T_Q4_K>(row, c, y); break;
    case T_Q6_K: deq32<T_Q6_K>(row, c, y); break;
    case T_Q5_0: deq32<T_Q5_0>(row, c, y); break;
    case T_Q8_0: deq32<T_Q8_0>(row, c, y); break;
    case T_Q4_0: deq32<T_Q4_0>(row, c, y); break;
    case T_Q4_1: deq32<T_Q4_1>(row, c, y); break;
    case T_Q5_1: deq32<T_Q5_1>(row, c, y); break;
    case T_Q5_K: deq32<T_Q5_K>(row, c, y); break;
    case T_F16: deq32<T_F16>(row, c, y); break;
    case T_BF16: deq32<T_BF16>(row, c, y); break;
    default: deq32<T_F32>(row, c, y); break;
  }
}

// W (rows x cols, quantized) -> f16 row-major, one thread per 32-value chunk (prefill GEMMs).
extern "C" __global__ void dequant_f16(Seg s, int cols, u16* out) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  int per_row = cols / 32;
  if (i >= (u64)s.rows * per_row) return;
  u64 r = i / per_row;
  int c = (int)(i % per_row);
  float y[32];
  deq(s.type, s.w + r * s.row_bytes, c, y);
  uint4* o = (uint4*)(out + r * cols + c * 32);  // 64 bytes, 16-byte stores
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const float* v = y + 8 * k;
    uint4 u;
    u.x = (u32)f2h(v[0]) | ((u32)f2h(v[1]) << 16);
    u.y = (u32)f2h(v[2]) | ((u32)f2h(v[3]) << 16);
    u.z = (u32)f2h(v[4]) | ((u32)f2h(v[5]) << 16);
    u.w = (u32)f2h(v[6]) | ((u32)f2h(v[7]) << 16);
    o[k] = u;
  }
}

// x[t] = embedding row of toks[t] (f32). Grid: tokens; block: chunks of the row.
extern "C" __global__ void embed(Seg s, int cols, const int* toks, float* x) {
  int t = blockIdx.x;
  const u8* row = s.w + (u64)toks[t] * s.row_bytes;
  float y[32];
  for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
    deq(s.type, row, c, y);
    for (int k = 0; k < 32; k++) x[(u64)t * cols + c * 32 + k] = y[k];
  }
}

// Q/K/V bias, RoPE on Q and K, K and V into the f16 cache at positions pos0 + t. Q is rounded to
// f16 (as llama.cpp's flash attention reads it); with qperm it is also written in f16, grouped by
// KV head ([kv_head][t][j][hd]) for the prefill GEMMs. Grid: tokens; block: 256 threads.
extern "C" __global__ void rope_store(float* qkv, const float* bias, const float* cosv, const float* sinv,
                                      const int* pos, int n_head, int n_kv_head, int hd, int neox,
                                      u16* kc, u16* vc, u16* qperm, int ntok) {
  int t = blockIdx.x;
  int p = *pos + t;
  int qd = n_head * hd, kvd = n_kv_head * hd, row = qd + 2 * kvd, half = hd / 2;
  float* r = qkv + (u64)t * row;
  if (bias) {
    for (int i = threadIdx.x; i < row; i += blockDim.x) r[i] += bias[i];
    __syncthreads();
  }
  const float* cs = cosv + (u64)p * half;
  const float* sn = sinv + (u64)p * half;
  int nh = n_head + n_kv_head;
  for (int i = threadIdx.x; i < nh * half; i += blockDim.x) {
    int h = i / half, k = i % half;
    float* v = r + h * hd;  // K heads follow the Q heads
    int a = neox ? k : 2 * k, b = neox ? k + half : 2 * k + 1;
    float x0 = v[a], x1 = v[b];
    float y0 = x0 * cs[k] - x1 * sn[k], y1 = x0 * sn[k] + x1 * cs[k];
    if (h < n_head) {
      u16 h0 = f2h(y0), h1 = f2h(y1);
      v[a] = h2f(h0);
      v[b] = h2f(h1);
      if (qperm) {
        int g = n_head / n_kv_head, kvh = h / g, j = h % g;
        u16* q = qperm + (((u64)kvh * ntok + t) * g + j) * hd;
        q[a] = h0;
        q[b] = h1;
      }
    } else {
      kc[(u64)p * kvd + (h - n_head) * hd + a] = f2h(y0);
      kc[(u64)p * kvd + (h - n_head) * hd + b] = f2h(y1);
    }
  }
  for (int i = threadIdx.x; i < kvd; i += blockDim.x) vc[(u64)p * kvd + i] = f2h(r[qd + kvd + i]);
}

// Decode attention, split over the sequence (flash decoding): block (kv head, split) scores the
// split's keys against the g query heads of that KV head (GQA without copies) and writes an
// unnormalised partial output with its max and sum; the last split block of a KV head to finish
// combines the splits and quantizes the g heads' outputs to q8 for the O matvec. Block: 256
// threads. HD (head dim) is a template parameter so that the K row loads unroll.
template <int HD>
__device__ void attn_decode_t(const float* qkv, const u16* kc, const u16* vc, const int* pos,
                              int n_head, int n_kv_head, float scale, float* part_o, float2* part_ml,
                              u32* counters, i8* aq, float2* ad) {
  constexpr int QUADS = HD / 4, GROUPS = 256 / QUADS;
  __shared__ float qs[MAXG * HD];
  __shared__ float sc[MAXG * SPLIT];
  __shared__ float red[GROUPS * MAXG * HD];
  __shared__ bool last;
  int kvh = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
  int g = n_head / n_kv_head, kvd = n_kv_head * HD;
  int len = *pos + 1;
  int k0 = split * SPLIT;
  int n = min(SPLIT, len - k0);
  if (n <= 0) return;  // splits past the sequence take no part
  for (int i = tid; i < g * HD; i += blockDim.x) qs[i] = qkv[kvh * g * HD + i] * scale;
  __syncthreads();
  if (tid < n) {
    const uint4* kr = (const uint4*)(kc + (u64)(k0 + tid) * kvd + kvh * HD);
    uint4 u[HD / 8];
#pragma unroll
    for (int d8 = 0; d8 < HD / 8; d8++) u[d8] = kr[d8];
    float acc[MAXG];
#pragma unroll
    for (int h = 0; h < MAXG; h++) acc[h] = 0.f;
#pragma unroll
    for (int d8 = 0; d8 < HD / 8; d8++) {
      float kv[8];
      kv[0] = h2f(u[d8].x & 0xffff); kv[1] = h2f(u[d8].x >> 16);
      kv[2] = h2f(u[d8].y & 0xffff); kv[3] = h2f(u[d8].y >> 16);
      kv[4] = h2f(u[d8].z & 0xffff); kv[5] = h2f(u[d8].z >> 16);
      kv[6] = h2f(u[d8].w & 0xffff); kv[7] = h2f(u[d8].w >> 16);
#pragma unroll
      for (int h = 0; h < MAXG; h++) {
        if (h < g) {
          const float* q = qs + h * HD + d8 * 8;
#pragma unroll
          for (int e = 0; e < 8; e++) acc[h] += q[e] * kv[e];
        }
      }
    }
#pragma unroll
    for (int h = 0; h < MAXG; h++)
      if (h < g) sc[h * SPLIT + tid] = acc[h];
  }
  __syncthreads();
  // Softmax pieces per head: warp w takes heads w, w+8, ...
  int lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
  for (int h = w; h < g; h += nw) {
    float m = NEG_INF;
    for (int k = lane; k < n; k += 32) m = fmaxf(m, sc[h * SPLIT + k]);
    m = warp_max(m);
    float l = 0.f;
    for (int k = lane; k < n; k += 32) {
      float e = expf(sc[h * SPLIT + k] - m);
      sc[h * SPLIT + k] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) part_ml[split * n_head + kvh * g + h] = make_float2(m, l);
  }
  __syncthreads();
  // P.V: thread = (4 dimensions, key group); the groups are summed through shared memory.
  int dq = tid % QUADS, kg = tid / QUADS;
  float a[4][MAXG];
#pragma unroll
  for (int h = 0; h < MAXG; h++) a[0][h] = a[1][h] = a[2][h] = a[3][h] = 0.f;
  const uint2* vr = (const uint2*)(vc + (u64)k0 * kvd + kvh * HD) + dq;
#pragma unroll 4
  for (int k = kg; k < n; k += GROUPS) {
    uint2 v = vr[(u64)k * (kvd / 4)];
    float v0 = h2f(v.x & 0xffff), v1 = h2f(v.x >> 16), v2 = h2f(v.y & 0xffff), v3 = h2f(v.y >> 16);
#pragma unroll
    for (int h = 0; h < MAXG; h++)
      if (h < g) {
        float p = sc[h * SPLIT + k];
        a[0][h] += p * v0;
        a[1][h] += p * v1;
        a[2][h] += p * v2;
        a[3][h] += p * v3;
      }
  }
#pragma unroll
  for (int h = 0; h < MAXG; h++)
    if (h < g)
#pragma unroll
      for (int e = 0; e < 4; e++) red[(kg * MAXG + h) * HD + 4 * dq + e] = a[e][h];
  __syncthreads();
  for (int i = tid; i < g * HD; i += blockDim.x) {
    int h = i / HD, d = i % HD;
    float v = 0.f;
#pragma unroll
    for (int j = 0; j < GROUPS; j++) v += red[(j * MAXG + h) * HD + d];
    part_o[((u64)split * n_head + kvh * g + h) * HD + d] = v;
  }
  // The last block of this KV head combines the splits (threadfence reduction): every thread
  // makes its partial results visible device-wide before the block takes its ticket, and the
  // last block reads the others' results from L2 (__ldcg), never from a stale L1 line.
  __threadfence();
  __syncthreads();
  int ns = (len + SPLIT - 1) / SPLIT;
  if (tid == 0) last = atomicAdd(&counters[kvh], 1) == (u32)(ns - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int b = w; b < g * HD / 32; b += nw) {
    int h = kvh * g + (b * 32) / HD, d = (b * 32) % HD + lane;
    float m = NEG_INF;
    for (int s = 0; s < ns; s++) m = fmaxf(m, __ldcg(&part_ml[s * n_head + h]).x);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < ns; s++) {
      float2 ml = __ldcg(&part_ml[s * n_head + h]);
      float e = expf(ml.x - m);
      den += ml.y * e;
      num += __ldcg(&part_o[((u64)s * n_head + h) * HD + d]) * e;
    }
    int i = h * HD + d;
    quant_lane(num / den, aq + (i & ~31), ad + i / 32);
  }
  if (tid == 0) counters[kvh] = 0;
}
extern "C" __global__ void attn_decode64(const float* qkv, const u16* kc, const u16* vc, const int* pos, int n_head,
                                         int n_kv_head, float scale, float* part_o, float2* part_ml,
                                         u32* counters, i8* aq, float2* ad) {
  attn_decode_t<64>(qkv, kc, vc, pos, n_head, n_kv_head, scale, part_o, part_ml, counters, aq, ad);
}
extern "C" __global__ void attn_decode128(const float* qkv, const u16* kc, const u16* vc, const int* pos, int n_head,
                                          int n_kv_head, float scale, float* part_o, float2* part_ml,
                                          u32* counters, i8* aq, float2* ad) {
  attn_decode_t<128>(qkv, kc, vc, pos, n_head, n_kv_head, scale, part_o, part_ml, counters, aq, ad);
}

// Prefill attention, step 2 of 3 (between two cuBLAS batched GEMMs): causal softmax of the scores
// S [kv_head][t*g + j][L] (row stride ld) of `ntok` queries starting at query t0 of the batch into
// P (f16, same layout). Query t0 + t sees keys 0..pos0 + t0 + t.
extern "C" __global__ void softmax_causal(const float* s, u16* p, int ld, int L, int g, int ntok, const int* pos, int t0) {
  __shared__ float red[32];
  u64 r = blockIdx.x;
  int t = t0 + (int)((r % ((u64)ntok * g)) / g);
  int valid = *pos + t + 1;
  const float* sr = s + r * ld;
  u16* pr = p + r * ld;
  float m = NEG_INF;
  for (int k = threadIdx.x; k < valid; k += blockDim.x) m = fmaxf(m, sr[k]);
  // block max via the sum helper's pattern
  {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    m = warp_max(m);
    __syncthreads();
    if (lane == 0) red[w] = m;
    __syncthreads();
    float t2 = lane < nw ? red[lane] : NEG_INF;
    m = warp_max(t2);
  }
  float l = 0.f;
  for (int k = threadIdx.x; k < valid; k += blockDim.x) l += expf(sr[k] - m);
  l = block_sum(l, red);
  float inv = 1.f / l;
  for (int k = threadIdx.x; k < L; k += blockDim.x) pr[k] = f2h(k < valid ? expf(sr[k] - m) * inv : 0.f);
}

// Prefill attention, step 3: O [kv_head][t*g + j][hd] (f32) -> att [t][head*hd] (f16).
extern "C" __global__ void unpermute_f16(const float* o, u16* att, int n_head, int n_kv_head, int hd, int ntok) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64 total = (u64)ntok * n_head * hd;
  if (i >= total) return;
  int d = (int)(i % hd);
  u64 th = i / hd;
  int h = (int)(th % n_head), t = (int)(th / n_head);
  int g = n_head / n_kv_head, kvh = h / g, j = h % g;
  att[i] = f2h(o[(((u64)kvh * ntok + t) * g + j) * hd + d]);
}

// Prefill attention, flash-attention style: block (query tile of FA_Q tokens, query head) walks the
// cache in tiles of FA_K keys held in shared memory, with an online softmax; the score matrix never
// leaves registers. Four threads per query, each with HD/4 dimensions of q and of the accumulator
// (scores summed with two shuffles). Query t (at position pos0 + t) sees keys 0..pos0 + t; GQA reads
// the KV head's cache rows in place. Output: att [t][head * HD] in f16 for the O GEMM.
#define FA_Q 64
#define FA_K 32
template <int HD>
__device__ void flash_prefill_t(const float* qkv, const u16* kc, const u16* vc, const int* pos, int ntok,
                                int n_head, int n_kv_head, float scale, u16* att) {
  constexpr int QD = HD / 4, Q4 = QD / 4, R4 = HD / 4;
  __shared__ float4 ks[FA_K * R4];
  __shared__ float4 vs[FA_K * R4];
  int h = blockIdx.y, g = n_head / n_kv_head, kvh = h / g;
  int qi = threadIdx.x >> 2, quarter = threadIdx.x & 3;
  int t = blockIdx.x * FA_Q + qi;
  int pos0 = *pos;
  int row = (n_head + 2 * n_kv_head) * HD, kvd = n_kv_head * HD;
  bool active = t < ntok;
  float q[QD], acc[QD];
#pragma unroll
  for (int d = 0; d < QD; d++) {
    q[d] = active ? qkv[(u64)t * row + h * HD + quarter * QD + d] * scale : 0.f;
    acc[d] = 0.f;
  }
  float m = NEG_INF, l = 0.f;
  int qpos = pos0 + t;
  int kmax = pos0 + min(ntok, blockIdx.x * FA_Q + FA_Q) - 1;  // last key any query here sees
  for (int k0 = 0; k0 <= kmax; k0 += FA_K) {
    __syncthreads();
    for (int i = threadIdx.x; i < FA_K * R4; i += blockDim.x) {
      int key = k0 + i / R4, d4 = i % R4;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (key <= kmax) {
        uint2 a = *(const uint2*)(kc + (u64)key * kvd + kvh * HD + 4 * d4);
        uint2 b = *(const uint2*)(vc + (u64)key * kvd + kvh * HD + 4 * d4);
        kv = make_float4(h2f(a.x & 0xffff), h2f(a.x >> 16), h2f(a.y & 0xffff), h2f(a.y >> 16));
        vv = make_float4(h2f(b.x & 0xffff), h2f(b.x >> 16), h2f(b.y & 0xffff), h2f(b.y >> 16));
      }
      ks[i] = kv;
      vs[i] = vv;
    }
    __syncthreads();
    float s[FA_K];
    float mt = NEG_INF;
#pragma unroll
    for (int j = 0; j < FA_K; j++) {
      const float4* kr = ks + j * R4 + quarter * Q4;
      float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;  // four independent chains
#pragma unroll
      for (int d4 = 0; d4 < Q4; d4++) {
        float4 k = kr[d4];
        p0 += q[4 * d4] * k.x;
        p1 += q[4 * d4 + 1] * k.y;
        p2 += q[4 * d4 + 2] * k.z;
        p3 += q[4 * d4 + 3] * k.w;
      }
      float p = (p0 + p1) + (p2 + p3);
      p += __shfl_xor_sync(0xffffffff, p, 1);
      p += __shfl_xor_sync(0xffffffff, p, 2);
      if (k0 + j > qpos) p = NEG_INF;
      s[j] = p;
      mt = fmaxf(mt, p);
    }
    float mn = fmaxf(m, mt);
    float c = expf(m - mn);
    l *= c;
#pragma unroll
    for (int d = 0; d < QD; d++) acc[d] *= c;
#pragma unroll
    for (int j = 0; j < FA_K; j++) {
      float p = s[j] <= NEG_INF ? 0.f : expf(s[j] - mn);
      l += p;
      const float4* vr = vs + j * R4 + quarter * Q4;
#pragma unroll
      for (int d4 = 0; d4 < Q4; d4++) {
        float4 v = vr[d4];
        acc[4 * d4] += p * v.x;
        acc[4 * d4 + 1] += p * v.y;
        acc[4 * d4 + 2] += p * v.z;
        acc[4 * d4 + 3] += p * v.w;
      }
    }
    m = mn;
  }
  if (active) {
    float inv = 1.f / l;
    u16* o = att + (u64)t * n_head * HD + h * HD + quarter * QD;
#pragma unroll
    for (int d = 0; d < QD; d++) o[d] = f2h(acc[d] * inv);
  }
}
extern "C" __global__ void __launch_bounds__(256, 2) flash_prefill64(const float* qkv, const u16* kc, const u16* vc, const int* pos, int ntok,
                                           int n_head, int n_kv_head, float scale, u16* att) {
  flash_prefill_t<64>(qkv, kc, vc, pos, ntok, n_head, n_kv_head, scale, att);
}
extern "C" __global__ void __launch_bounds__(256, 2) flash_prefill128(const float* qkv, const u16* kc, const u16* vc, const int* pos, int ntok,
                                            int n_head, int n_kv_head, float scale, u16* att) {
  flash_prefill_t<128>(qkv, kc, vc, pos, ntok, n_head, n_kv_head, scale, att);
}

// h16[t][i] = silu(gu[t][i]) * gu[t][f + i] (prefill).
extern "C" __global__ void swiglu_f16(const float* gu, int f, int ntok, u16* h) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)ntok * f) return;
  u64 t = i / f, k = i % f;
  float g = gu[t * 2 * f + k], u = gu[t * 2 * f + f + k];
  h[i] = f2h(g / (1.f + expf(-g)) * u);
}

// Greedy: argmax of the logits (first index on ties), one kernel: each block reduces its part, the
// last block to finish reduces the partials, writes the token (input of the next step and the
// value the host reads) and advances pos by `advance`.
extern "C" __global__ void argmax(const float* x, int n, float2* partial, u32* counter, int* tok,
                                  int* out, int* pos, int advance) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ bool last;
  float v = NEG_INF * 10.f;
  int idx = 0x7fffffff;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float y = x[i];
    if (y > v) { v = y; idx = i; }
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    float v2 = __shfl_xor_sync(0xffffffff, v, o);
    int i2 = __shfl_xor_sync(0xffffffff, idx, o);
    if (v2 > v || (v2 == v && i2 < idx)) { v = v2; idx = i2; }
  }
  if (lane == 0) { bv[w] = v; bi[w] = idx; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < nw; k++)
      if (bv[k] > v || (bv[k] == v && bi[k] < idx)) { v = bv[k]; idx = bi[k]; }
    partial[blockIdx.x] = make_float2(v, __int_as_float(idx));
    __threadfence();
    last = atomicAdd(counter, 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    float2 b = __ldcg(&partial[0]);
    for (int k = 1; k < gridDim.x; k++) {
      float2 c = __ldcg(&partial[k]);
      if (c.x > b.x || (c.x == b.x && __float_as_int(c.y) < __float_as_int(b.y))) b = c;
    }
    int r = __float_as_int(b.y);
    if (r < 0 || r >= n) r = 0;  // only when every logit is NaN
    *tok = r;
    *out = r;
    *pos += advance;
    *counter = 0;
  }
}

// Sampling, step 1: each block keeps the top K (value desc, index asc) of its slice of the logits.
#define KMAX 64
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }
// The block's first (value desc, index asc) of every thread's (v, idx), returned to every thread.
// wv, wi: shared scratch of 32 entries.
__device__ void block_best(float& v, int& idx, float* wv, int* wi) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    float v2 = __shfl_xor_sync(0xffffffff, v, o);
    int i2 = __shfl_xor_sync(0xffffffff, idx, o);
    if (before(v2, i2, v, idx)) { v = v2; idx = i2; }
  }
  if (lane == 0) { wv[w] = v; wi[w] = idx; }
  __syncthreads();
  v = wv[0]; idx = wi[0];
  for (int j = 1; j < nw; j++)
    if (before(wv[j], wi[j], v, idx)) { v = wv[j]; idx = wi[j]; }
  __syncthreads();
}
extern "C" __global__ void topk_partial(const float* x, int n, int k, int slice, float2* cand) {
  __shared__ float wv[32];
  __shared__ int wi[32];
  int start = blockIdx.x * slice, end = min(n, start + slice);
  float pv = 3.4e38f;
  int pi = -1;  // the previous pick: the next must come after it in the order
  for (int r = 0; r < k; r++) {
    float v = NEG_INF * 10.f;
    int idx = 0x7fffffff;
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
      float y = x[i];
      if (before(pv, pi, y, i) && before(y, i, v, idx)) { v = y; idx = i; }
    }
    block_best(v, idx, wv, wi);
    if (threadIdx.x == 0) cand[blockIdx.x * k + r] = make_float2(v, __int_as_float(idx));
    pv = v; pi = idx;
  }
}

__device__ float uniform(u64 seed, u64 ctr) {  // splitmix64 of (seed, counter) -> [0, 1)
  u64 z = seed + (ctr + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// Sampling, step 2 (one block of 256 threads): merge the candidates into the global top K, then
// llama.cpp's chain: softmax for top-p and min-p, temperature on the survivors, seeded draw.
// Writes the token like argmax (input of the next step, host read-back); ctr counts draws.
extern "C" __global__ void sample_final(const float2* cand, int ncand, int k, float temp, float top_p, float min_p,
                                        u64 seed, u64* ctr, int* tok, int* out, int* pos, int advance) {
  __shared__ float tv[KMAX];
  __shared__ int ti[KMAX];
  __shared__ float wv[32];
  __shared__ int wi[32];
  float pv = 3.4e38f;
  int pi = -1;
  for (int r = 0; r < k; r++) {
    float v = NEG_INF * 10.f;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < ncand; i += blockDim.x) {
      float2 c = cand[i];
      int ci = __float_as_int(c.y);
      if (ci != 0x7fffffff && before(pv, pi, c.x, ci) && before(c.x, ci, v, idx)) { v = c.x; idx = ci; }
    }
    block_best(v, idx, wv, wi);
    if (threadIdx.x == 0) { tv[r] = v; ti[r] = idx; }
    pv = v; pi = idx;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int kk = 0;
  while (kk < k && ti[kk] != 0x7fffffff) kk++;
  float mx = tv[0], sum = 0.f;
  for (int i = 0; i < kk; i++) { tv[i] = expf(tv[i] - mx); sum += tv[i]; }
  int keep = kk;
  if (top_p < 1.f) {
    float cum = 0.f;
    for (int i = 0; i < kk; i++) {
      cum += tv[i] / sum;
      if (cum >= top_p) { keep = i + 1; break; }
    }
  }
  if (min_p > 0.f) {
    int c = 0;
    while (c < kk && tv[c] >= min_p * tv[0]) c++;
    keep = min(keep, max(c, 1));
  }
  keep = max(keep, 1);
  float inv_t = 1.f / temp, total = 0.f;
  for (int i = 0; i < keep; i++) { tv[i] = powf(tv[i], inv_t); total += tv[i]; }
  float r = uniform(seed, *ctr) * total;
  *ctr += 1;
  int pick = ti[keep - 1];
  for (int i = 0; i < keep; i++) {
    r -= tv[i];
    if (r <= 0.f) { pick = ti[i]; break; }
  }
  if (pick == 0x7fffffff) pick = 0;  // only when every logit is NaN
  *tok = pick;
  *out = pick;
  *pos += advance;
}

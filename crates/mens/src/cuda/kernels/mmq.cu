// ---------------------------------------------------------------------------------------------
// int8 tensor-core batch kernels for Q4_K and Q6_K matrices: the speculative verify pass and the
// server's few-row steps. The chunk dots of a tile of 16 weight rows with 8 activation rows come
// from mma.sync (s8 x s8 -> s32: exact, the integers dp4a gives); each (weight row, activation
// row, chunk) then gets the matrix-vector kernel's float expression (finish) in the matrix-vector
// kernel's order: 32 streams (chunk c in stream c % 32, in increasing c), then warp_sum's tree
// over the streams. So a row's result has the bits of decoding it alone.
// The 8 warps of a block take a tile together: warp w = 4hh + q the chunks 4hh .. 4hh + 3 of
// superblocks q, q + 4, ... (streams 8q + 4hh .. 8q + 4hh + 3), half a superblock's bytes of its 16
// rows at a time (each header and each byte of nibbles loaded once). The block's 8 activation rows
// are copied to shared memory (coalesced, 4096 columns at a time) and read from there by all its
// warps, for all the block's tiles when they fit at once.

#define MQ_SEG 4096                 // activation columns staged at a time
#define MQ_PITCH (MQ_SEG + 16)      // bytes between staged rows: conflict-free fragment reads
#define MQ_DPITCH (MQ_SEG / 32 + 2) // float2 between staged rows of scales
#ifndef MQ_MINB
#define MQ_MINB 2
#endif

// D (16 x 8) = A (16 x 32) . B (32 x 8), s8 in, s32 out. Thread (g = lane / 4, t = lane % 4):
// a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..];
// b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1].
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  d[0] = d[1] = d[2] = d[3] = 0;
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with k = 16: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], b0 = B[4t..4t+3][g].
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], u32 a0, u32 a1, u32 b0) {
  d[0] = d[1] = d[2] = d[3] = 0;
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// The staged activations: xs [8][MQ_PITCH] bytes, ds [8][MQ_DPITCH] (d, s) per chunk.
struct MqAct {
  const u8* xs;
  const float2* ds;
};

// The half superblock (chunks 4hh .. 4hh + 3) thread t of an MMA quad needs from one weight row.
// Q4_K: the header and, for each pair of chunks (low and high nibbles of the same 32 bytes), bytes
// 8t..8t+7: values 8t..8t+7 of both chunks (the MMA's k slots are a permutation of a chunk's
// values; the activations are read in the same one). Q6_K: for each 16-value half of a chunk,
// values 4t..4t+3 (low bits: words [chunk & 1][half], high bits: [half]), the chunks' scales, d.
template <int T>
struct MqSb;
template <>
struct MqSb<T_Q4_K> {
  int4 h;
  uint2 q[2];
};
template <>
struct MqSb<T_Q6_K> {
  u32 l[4], h[2], sc[2], d;
};
__device__ __forceinline__ void mq_load(MqSb<T_Q4_K>& r, const u8* row, int sb, int hh, int t) {
  const u8* b = row + (u64)sb * 144;
  r.h = *(const int4*)b;
#pragma unroll
  for (int j = 0; j < 2; j++) r.q[j] = *(const uint2*)(b + 16 + 32 * (2 * hh + j) + 8 * t);
}
__device__ __forceinline__ void mq_load(MqSb<T_Q6_K>& r, const u8* row, int sb, int hh, int t) {
  const u8* b = row + (u64)sb * 210;
#pragma unroll
  for (int i = 0; i < 4; i++) r.l[i] = (u32)ld2(b + hh * 64 + (i >> 1) * 32 + (i & 1) * 16 + 4 * t);
#pragma unroll
  for (int i = 0; i < 2; i++) r.h[i] = (u32)ld2(b + 128 + hh * 32 + i * 16 + 4 * t);
#pragma unroll
  for (int i = 0; i < 2; i++) r.sc[i] = (u32)ld2(b + 192 + 8 * hh + 4 * i);
  r.d = *(const u16*)(b + 208);
}

__device__ __forceinline__ u32 q6_bytes(u32 l, u32 h, int lsh, int hsh) {
  return (u32)sub32((int)(((l >> lsh) & 0x0F0F0F0Fu) | (((h >> hsh) & 0x03030303u) << 4)));
}

// acc[kk][e] += the dot32 terms of chunk k = 4hh + kk of a superblock whose chunk 0 is staged
// chunk c, for the tile's rows x = g, y = g + 8 and activation rows 2t (e = 0, 2) and 2t + 1
// (e = 1, 3).
__device__ __forceinline__ void mq_sb(const MqSb<T_Q4_K>& x, const MqSb<T_Q4_K>& y, int c, int hh, const MqAct& a,
                                      int g, int t, float (&acc)[4][4]) {
  const u32 M = 0x0F0F0F0Fu;
  float hx = h2f((u16)(x.h.x & 0xffff)), mx = h2f((u16)((u32)x.h.x >> 16));
  float hy = h2f((u16)(y.h.x & 0xffff)), my = h2f((u16)((u32)y.h.x >> 16));
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    int k = 4 * hh + kk, j = kk >> 1, sh = (kk & 1) * 4;
    uint2 b = *(const uint2*)(a.xs + g * MQ_PITCH + (c + k) * 32 + 8 * t);
    float2 d0 = a.ds[2 * t * MQ_DPITCH + c + k], d1 = a.ds[(2 * t + 1) * MQ_DPITCH + c + k];
    int d[4];
    mma_s8_k32(d, (x.q[j].x >> sh) & M, (y.q[j].x >> sh) & M, (x.q[j].y >> sh) & M, (y.q[j].y >> sh) & M, b.x, b.y);
    W32 wx, wy;
    q4k_scale_min(x.h, k, &wx.s0, &wx.s1);
    q4k_scale_min(y.h, k, &wy.s0, &wy.s1);
    wx.a = hx;
    wx.b = mx;
    wy.a = hy;
    wy.b = my;
    // finish() of the chunk's two halves' sums: (float)(lo + hi) = (float)(d + 0).
    acc[kk][0] += finish<T_Q4_K>(wx, d[0], 0, d0.x, d0.y);
    acc[kk][1] += finish<T_Q4_K>(wx, d[1], 0, d1.x, d1.y);
    acc[kk][2] += finish<T_Q4_K>(wy, d[2], 0, d0.x, d0.y);
    acc[kk][3] += finish<T_Q4_K>(wy, d[3], 0, d1.x, d1.y);
  }
}
__device__ __forceinline__ void mq_sb(const MqSb<T_Q6_K>& x, const MqSb<T_Q6_K>& y, int c, int hh, const MqAct& a,
                                      int g, int t, float (&acc)[4][4]) {
  float dx = h2f((u16)x.d), dy = h2f((u16)y.d);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    int k = 4 * hh + kk, lsh = (kk >> 1) * 4, hsh = 2 * kk, li = (kk & 1) * 2;
    const u8* ab = a.xs + g * MQ_PITCH + (c + k) * 32;
    u32 b0 = *(const u32*)(ab + 4 * t), b1 = *(const u32*)(ab + 16 + 4 * t);
    float2 d0 = a.ds[2 * t * MQ_DPITCH + c + k], d1 = a.ds[(2 * t + 1) * MQ_DPITCH + c + k];
    int lo[4], hi[4];
    mma_s8_k16(lo, q6_bytes(x.l[li], x.h[0], lsh, hsh), q6_bytes(y.l[li], y.h[0], lsh, hsh), b0);
    mma_s8_k16(hi, q6_bytes(x.l[li + 1], x.h[1], lsh, hsh), q6_bytes(y.l[li + 1], y.h[1], lsh, hsh), b1);
    // The scales of chunk k: bytes 2kk, 2kk + 1 of the half's 8.
    u32 sx = x.sc[kk >> 1] >> (16 * (kk & 1)), sy = y.sc[kk >> 1] >> (16 * (kk & 1));
    W32 wx, wy;
    wx.a = dx;
    wx.s0 = (int)(i8)(sx & 0xff);
    wx.s1 = (int)(i8)((sx >> 8) & 0xff);
    wy.a = dy;
    wy.s0 = (int)(i8)(sy & 0xff);
    wy.s1 = (int)(i8)((sy >> 8) & 0xff);
    acc[kk][0] += finish<T_Q6_K>(wx, lo[0], hi[0], d0.x, d0.y);
    acc[kk][1] += finish<T_Q6_K>(wx, lo[1], hi[1], d1.x, d1.y);
    acc[kk][2] += finish<T_Q6_K>(wy, lo[2], hi[2], d0.x, d0.y);
    acc[kk][3] += finish<T_Q6_K>(wy, lo[3], hi[3], d1.x, d1.y);
  }
}

// Copy activation rows b0 .. b0 + 7 (act_row: past B, row B - 1 again), chunks c0 .. c0 + n - 1,
// into shared memory, by the whole block (between two __syncthreads()).
__device__ __forceinline__ void mq_stage(u8* xs, float2* ds, const i8* aq, const float2* ad, int cols, int b0,
                                         int B, int c0, int n) {
  int nchunks = cols / 32, per = n * 2;  // 16-byte pieces a row
  for (int i = threadIdx.x; i < 8 * per; i += blockDim.x) {
    int j = i / per, p = i % per;
    const u8* src = (const u8*)(aq + act_row(b0, j, B) * cols) + c0 * 32 + 16 * p;
    *(uint4*)(xs + j * MQ_PITCH + 16 * p) = *(const uint4*)src;
  }
  for (int i = threadIdx.x; i < 8 * n; i += blockDim.x) {
    int j = i / n, k = i % n;
    ds[j * MQ_DPITCH + k] = ad[act_row(b0, j, B) * nchunks + c0 + k];
  }
}

// Warp w's streams of one tile (rows x, y) against activation rows b0 .. b0 + 7. `staged`: all
// the columns are already in shared memory; else they are staged here segment by segment (all
// warps of the block call this together).
template <int T>
__device__ __forceinline__ void mq_tile(const u8* x, const u8* y, int cols, const i8* aq, const float2* ad, int b0,
                                        int B, u8* xs, float2* ds, bool staged, float (&acc)[4][4]) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, q = w & 3, hh = w >> 2, g = lane >> 2, t = lane & 3;
  int nchunks = cols / 32;
#pragma unroll
  for (int k = 0; k < 4; k++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[k][e] = 0.f;
  MqAct a = {xs, ds};
  for (int c0 = 0; c0 < nchunks; c0 += MQ_SEG / 32) {
    int n = min(MQ_SEG / 32, nchunks - c0);
    if (!staged) {
      __syncthreads();  // the last segment's reads are done
      mq_stage(xs, ds, aq, ad, cols, b0, B, c0, n);
      __syncthreads();
    }
    // Superblocks c0 / 8 + s for s = q, q + 4, ... (c0 / 8 is a multiple of 4: the warp's
    // superblocks are q mod 4 overall, its streams in increasing order).
    for (int s = q; s < n / 8; s += 4) {
      MqSb<T> rx, ry;
      mq_load(rx, x, c0 / 8 + s, hh, t);
      mq_load(ry, y, c0 / 8 + s, hh, t);
      mq_sb(rx, ry, 8 * s, hh, a, g, t, acc);
    }
  }
}

// The tile's 32 streams summed as warp_sum sums a warp's lanes (xor 16, 8, 4, 2, 1): warp w
// holds streams 8(w & 3) + 4(w >> 2) + kk; each fold adds the upper streams' values, passed
// through red (4 KB), to the lower ones'. The sums end in warp 0: acc[0][e].
__device__ __forceinline__ void mq_fold_into(float (&acc)[4][4], float* red, int from, int to, int base) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int slot = (w == from || w == to) ? 0 : (w == from + 4 || w == to + 4) ? 1 : -1;
  if (base >= 0) slot = 0;  // the last fold: one warp to one warp
  if (w == from || (base < 0 && w == from + 4))
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[((slot * 4 + k) * 4 + e) * 32 + lane] = acc[k][e];
  __syncthreads();
  if (w == to || (base < 0 && w == to + 4))
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[k][e] = acc[k][e] + red[((slot * 4 + k) * 4 + e) * 32 + lane];
  __syncthreads();
}
__device__ __forceinline__ void mq_reduce(float (&acc)[4][4], float* red) {
  mq_fold_into(acc, red, 2, 0, -1);  // streams 16..23 (+4) onto 0..7 (+4)
  mq_fold_into(acc, red, 3, 1, -1);  // 24..31 onto 8..15
  mq_fold_into(acc, red, 1, 0, -1);  // 8..15 onto 0..7
  mq_fold_into(acc, red, 4, 0, 0);   // 4..7 onto 0..3
#pragma unroll
  for (int e = 0; e < 4; e++) {
    acc[0][e] = acc[0][e] + acc[2][e];
    acc[1][e] = acc[1][e] + acc[3][e];
    acc[0][e] = acc[0][e] + acc[1][e];
  }
}

// matmul_q8_t's contract (stacked matrices, out row orow[b], bias, mode) for matrices of type T
// (cols a multiple of 256): a block takes tiles of 16 weight rows (ceil(tiles / gridDim.x) of
// them, consecutive), activation rows 8 at a time.
template <int T>
__device__ void matmul_mq_t(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B, float* out,
                            int ldo, const int* orow, const float* bias, int mode) {
  __shared__ __align__(16) u8 xs[8 * MQ_PITCH];
  __shared__ float2 ds[8 * MQ_DPITCH];
  __shared__ float red[2 * 4 * 4 * 32];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int total = s0.rows + s1.rows + s2.rows, ntiles = (total + 15) / 16;
  int per = (ntiles + gridDim.x - 1) / gridDim.x, tile0 = blockIdx.x * per, tile1 = min(tile0 + per, ntiles);
  bool once = cols <= MQ_SEG;  // the activations stay staged for all the block's tiles
  for (int b0 = 0; b0 < B; b0 += 8) {
    if (once) {
      __syncthreads();
      mq_stage(xs, ds, aq, ad, cols, b0, B, 0, cols / 32);
      __syncthreads();
    }
    for (int tile = tile0; tile < tile1; tile++) {
      int r0 = tile * 16, type;
      const u8* x = seg_row(s0, s1, s2, min(r0 + g, total - 1), &type);
      const u8* y = seg_row(s0, s1, s2, min(r0 + g + 8, total - 1), &type);
      float acc[4][4];
      mq_tile<T>(x, y, cols, aq, ad, b0, B, xs, ds, once, acc);
      mq_reduce(acc, red);
      if (w == 0) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int r = r0 + g + (e >> 1) * 8, b = b0 + 2 * t + (e & 1);
          if (r < total && b < B) {
            float v = acc[0][e] + (bias ? bias[r] : 0.f);
            float* o = out + (u64)(orow ? orow[b] : b) * ldo + r;
            *o = (mode & 1) ? *o + v : v;
          }
        }
      }
    }
  }
}

// glu_q8_t's contract for gate and up matrices of type T: a block makes 32 rows (one q8 block of
// every h[b]) as four tiles (gate and up, two halves), the activations staged once when they fit.
template <int T>
__device__ void glu_mq_t(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, int B, i8* hq, float2* hd,
                         const float* ns) {
  __shared__ __align__(16) u8 xs[8 * MQ_PITCH];
  __shared__ float2 ds[8 * MQ_DPITCH];
  __shared__ float red[2 * 4 * 4 * 32];
  __shared__ float h[8][32];
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int f = gate.rows;
  bool once = cols <= MQ_SEG;
  for (int b0 = 0; b0 < B; b0 += 8) {
    if (once) {
      __syncthreads();
      mq_stage(xs, ds, aq, ad, cols, b0, B, 0, cols / 32);
      __syncthreads();
    }
    for (int half = 0; half < 2; half++) {
      u64 r = blockIdx.x * 32 + half * 16 + g;
      float acc[4][4], gx[4];
      mq_tile<T>(gate.w + r * gate.row_bytes, gate.w + (r + 8) * gate.row_bytes, cols, aq, ad, b0, B, xs, ds, once, acc);
      mq_reduce(acc, red);
#pragma unroll
      for (int e = 0; e < 4; e++) gx[e] = acc[0][e];
      mq_tile<T>(up.w + r * up.row_bytes, up.w + (r + 8) * up.row_bytes, cols, aq, ad, b0, B, xs, ds, once, acc);
      mq_reduce(acc, red);
      if (w == 0)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float sc = ns ? ns[min(b0 + 2 * t + (e & 1), B - 1)] : 1.f;  // a deferred norm's scale
          float x = __fmul_rn(gx[e], sc), y = __fmul_rn(acc[0][e], sc);
          h[2 * t + (e & 1)][half * 16 + g + (e >> 1) * 8] = x / (1.f + expf(-x)) * y;
        }
    }
    __syncthreads();
    if (b0 + w < B)
      quant_lane(h[w][lane], hq + (u64)(b0 + w) * f + blockIdx.x * 32, hd + (u64)(b0 + w) * (f / 32) + blockIdx.x);
  }
}

#define MQ_KERNELS(SUF, T)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256, MQ_MINB)                                                 \
      matmul_mq_##SUF(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B, float* out,    \
                      int ldo, const int* orow, const float* bias, int mode) {                                \
    pdl_wait();  /* the dp4a step's graph launches with PDL */                                                \
    matmul_mq_t<T>(s0, s1, s2, cols, aq, ad, B, out, ldo, orow, bias, mode);                                  \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256, MQ_MINB)                                                 \
      glu_mq_##SUF(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, int B, i8* hq, float2* hd,     \
                   const float* ns) {                                                                        \
    pdl_wait();  /* the dp4a step's graph launches with PDL */                                                \
    glu_mq_t<T>(gate, up, cols, aq, ad, B, hq, hd, ns);                                                       \
  }
MQ_KERNELS(q4k, T_Q4_K)
MQ_KERNELS(q6k, T_Q6_K)

// A probe, not part of the engine: what Q4_K and Q6_K matrix products cost when the activations have one
// scale per 256 values (llama.cpp's Q8_K, as mens's CPU kernels use) and the weights' sub-block
// scales are applied in integers, so that a (weight row, activation row) pair needs one float
// term per 256 values instead of one per 32 (issue 18: the verify pass; docs/benchmarks.md,
// session 54). Appended to the batch module's sources (kernels/*.cu, -DMENS_BATCH_MODULE) by
// build.py, so the engine's own batch kernels are timed beside it from the same PTX.
//
// Activations ("q8k"): aq, int8 values, row b at aq + b * cols; dk, one float per 256 values
// (max |x| / 127); bs, each 32 values' sum of int8 values (int). A superblock s of weight row r
// against activation row b gives, for Q4_K (32-value sub-blocks j: scale sc_j, min m_j),
//   term = (d * da) * isum - (dmin * da) * msum,  isum = sum_j sc_j * (q_j . a_j),  msum = sum_j m_j * bs_j
// and for Q6_K (16-value sub-blocks i: signed scale sc_i, values q - 32)
//   term = (d * da) * isum,  isum = sum_i sc_i * ((q_i - 32) . a_i)
// (rounded multiplies, no contraction: both kernels make the same bits), and a row's result is
// the sum of NS streams, S_g the sum over superblocks s = g mod NS in increasing s: NS = 4,
// (S0 + S2) + (S1 + S3); NS = 8, ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)). The single-row
// kernel and the 8-row one of one NS follow this order, so a row's bits do not depend on the
// kernel (checked by probe.py).

// The GPU layouts' sums are their GGUF types' (as FINISH_AS in kernels/matvec.cu).
__device__ __forceinline__ constexpr int q8k_gguf(int t) { return t == T_Q4_KR ? T_Q4_K : t == T_Q6_KR ? T_Q6_K : t; }

template <int T>
__device__ __forceinline__ float q8k_term(float dw, float dmw, float da, int isum, int msum) {
  return __fsub_rn(__fmul_rn(__fmul_rn(dw, da), (float)isum), __fmul_rn(__fmul_rn(dmw, da), (float)msum));
}
template <>
__device__ __forceinline__ float q8k_term<T_Q6_K>(float dw, float dmw, float da, int isum, int msum) {
  return __fmul_rn(__fmul_rn(dw, da), (float)isum);
}

// A chunk's integer sums from the engine's unpacked chunk (W32, kernels/matvec.cu).
template <int T>
__device__ __forceinline__ void q8k_chunk(const W32& w, int4 a0, int4 a1, int bsum, int* is, int* ms);
template <>
__device__ __forceinline__ void q8k_chunk<T_Q4_K>(const W32& w, int4 a0, int4 a1, int bsum, int* is, int* ms) {
  *is = w.s0 * (dot16(w.q, a0) + dot16(w.q + 4, a1));
  *ms = w.s1 * bsum;
}
template <>
__device__ __forceinline__ void q8k_chunk<T_Q6_K>(const W32& w, int4 a0, int4 a1, int bsum, int* is, int* ms) {
  *is = w.s0 * dot16(w.q, a0) + w.s1 * dot16(w.q + 4, a1);
  *ms = 0;
}

// One row a warp, 4 rows a block: lane l takes chunk 32k + l, so lanes 8g .. 8g + 7 hold one
// superblock (4k + g); their integer sums are summed by shuffles (exact, in any order), and lane 8g
// adds the superblock's term to stream g (NS = 8: g on even passes, g + 4 on odd ones). Each lane
// loads its next chunk before it works on this one (the engine's Raw loads).
template <int T, int NS>
__device__ void q8k_matvec_t(const u8* w, u64 row_bytes, int rows, int cols, const i8* aq, const float* dk,
                             const int* bs, float* out) {
  int lane = threadIdx.x & 31, r = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= rows) return;
  const u8* row = w + (u64)r * row_bytes;
  int nchunks = cols / 32;
  float acc = 0.f, acc2 = 0.f;  // acc2: NS = 8, the odd passes
  Raw<T> raw;
  if (lane < nchunks) raw_load<T>(raw, row, lane, nchunks);
  for (int base = 0; base < nchunks; base += 32) {
    int c = base + lane;
    bool ok = c < nchunks;
    int is = 0, ms = 0;
    float dw = 0.f, dmw = 0.f, da = 0.f;
    if (ok) {
      W32 wv;
      raw_unpack<T>(raw, wv);
      if (c + 32 < nchunks) raw_load<T>(raw, row, c + 32, nchunks);
      const int4* ap = (const int4*)(aq + c * 32);
      q8k_chunk<q8k_gguf(T)>(wv, ap[0], ap[1], bs[c], &is, &ms);
      dw = wv.a;
      dmw = wv.b;
      da = dk[c >> 3];
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      is += __shfl_xor_sync(0xffffffffu, is, o);
      ms += __shfl_xor_sync(0xffffffffu, ms, o);
    }
    if (ok && (lane & 7) == 0) {
      float tm = q8k_term<q8k_gguf(T)>(dw, dmw, da, is, ms);
      if (NS == 8 && ((base >> 5) & 1)) acc2 = __fadd_rn(acc2, tm);
      else acc = __fadd_rn(acc, tm);
    }
  }
  // Lanes 0, 8, 16, 24 hold streams g (and g + 4), the others 0. NS = 4: (S0 + S2) + (S1 + S3);
  // NS = 8: ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)), in lane 0.
  if (NS == 8) acc = __fadd_rn(acc, acc2);
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 16));
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 8));
  if (lane == 0) out[r] = acc;
}

// The bytes thread t of an MMA quad needs from one weight row's superblock.
// Q4_K: the header and bytes 8t .. 8t + 7 of each 32-byte nibble pair (k slots 4t.. and 16 + 4t..
// are values 8t.. and 8t + 4.. of both chunks of the pair; the activations are read in that order).
// Q6_K: per half superblock, values 4t .. 4t + 3 of each 16-value half of its chunks (low bits:
// words [chunk & 1][half], high bits [half]), the half's 8 scales, d.
template <int T>
struct Q8kSb;
template <>
struct Q8kSb<T_Q4_K> {
  int4 h;
  uint2 q[4];
};
template <>
struct Q8kSb<T_Q6_K> {
  u32 l[8], hb[4], sc[4];
  u32 d;
};
// Superblock s of a row of n chunks, as thread t needs it.
__device__ __forceinline__ void q8k_load(Q8kSb<T_Q4_K>& r, const u8* row, int s, int t, int n) {
  const u8* b = row + (u64)s * 144;
  r.h = *(const int4*)b;
#pragma unroll
  for (int p = 0; p < 4; p++) r.q[p] = *(const uint2*)(b + 16 + 32 * p + 8 * t);
}
__device__ __forceinline__ void q8k_load(Q8kSb<T_Q6_K>& r, const u8* row, int s, int t, int n) {
  const u8* b = row + (u64)s * 210;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
#pragma unroll
    for (int i = 0; i < 4; i++) r.l[4 * hf + i] = (u32)ld2(b + hf * 64 + (i >> 1) * 32 + (i & 1) * 16 + 4 * t);
#pragma unroll
    for (int i = 0; i < 2; i++) r.hb[2 * hf + i] = (u32)ld2(b + 128 + hf * 32 + i * 16 + 4 * t);
#pragma unroll
    for (int i = 0; i < 2; i++) r.sc[2 * hf + i] = (u32)ld2(b + 192 + 8 * hf + 4 * i);
  }
  r.d = *(const u16*)(b + 208);
}
// Q4_KR: the header and word t of each chunk (values 4t.. in its low nibbles, 16 + 4t.. in its
// high ones: k slots 4t.. and 16 + 4t.., the activations in their own order).
template <>
struct Q8kSb<T_Q4_KR> {
  int4 h;
  u32 q[8];
};
__device__ __forceinline__ void q8k_load(Q8kSb<T_Q4_KR>& r, const u8* row, int s, int t, int n) {
  const u8* b = row + (u64)s * 144;
  r.h = *(const int4*)b;
#pragma unroll
  for (int j = 0; j < 8; j++) r.q[j] = *(const u32*)(b + 16 + 16 * j + 4 * t);
}
// Q6_KR (a row of n chunks: low nibbles at 16c, high bits at 16n + 8c, scales at 24n + 2c, d at
// 26n + 2 sb): per chunk, word t of the low nibbles, the two words of high bits, the scales; d.
template <>
struct Q8kSb<T_Q6_KR> {
  u32 l[8], hb[16], sc[8];
  u32 d;
};
__device__ __forceinline__ void q8k_load(Q8kSb<T_Q6_KR>& r, const u8* row, int s, int t, int n) {
#pragma unroll
  for (int j = 0; j < 8; j++) {
    int c = 8 * s + j;
    r.l[j] = *(const u32*)(row + 16 * c + 4 * t);
    uint2 h = *(const uint2*)(row + 16 * n + 8 * c);
    r.hb[2 * j] = h.x;
    r.hb[2 * j + 1] = h.y;
    r.sc[j] = *(const u16*)(row + 24 * n + 2 * c);
  }
  r.d = *(const u16*)(row + 26 * n + 2 * s);
}

// Chunk j's MMA sums d (rows x, y against activation rows 2t, 2t + 1) into a Q4_K superblock's
// integer sums: sc_j times the dots, m_j times the activations' chunk sums s0, s1.
__device__ __forceinline__ void q4k_mma_acc(int4 hx, int4 hy, int j, const int (&d)[4], int s0, int s1,
                                            int (&is)[4], int (&ms)[4]) {
  int scx, mx, scy, my;
  q4k_scale_min(hx, j, &scx, &mx);
  q4k_scale_min(hy, j, &scy, &my);
  is[0] += scx * d[0];
  is[1] += scx * d[1];
  is[2] += scy * d[2];
  is[3] += scy * d[3];
  ms[0] += mx * s0;
  ms[1] += mx * s1;
  ms[2] += my * s0;
  ms[3] += my * s1;
}
__device__ __forceinline__ void q4k_mma_scales(int4 hx, int4 hy, float (&dw)[2], float (&dm)[2]) {
  dw[0] = h2f((u16)(hx.x & 0xffff));
  dm[0] = h2f((u16)((u32)hx.x >> 16));
  dw[1] = h2f((u16)(hy.x & 0xffff));
  dm[1] = h2f((u16)((u32)hy.x >> 16));
}

// A Q6_K chunk's two 16-value MMA sums (lo, hi) into a superblock's integer sums: sx, sy hold
// the chunk's two int8 scales of rows x and y in their low 16 bits.
__device__ __forceinline__ void q6k_mma_acc(u32 sx, u32 sy, const int (&lo)[4], const int (&hi)[4], int (&is)[4]) {
  int x0 = (int)(i8)(sx & 0xff), x1 = (int)(i8)((sx >> 8) & 0xff);
  int y0 = (int)(i8)(sy & 0xff), y1 = (int)(i8)((sy >> 8) & 0xff);
  is[0] += x0 * lo[0] + x1 * hi[0];
  is[1] += x0 * lo[1] + x1 * hi[1];
  is[2] += y0 * lo[2] + y1 * hi[2];
  is[3] += y0 * lo[3] + y1 * hi[3];
}
__device__ __forceinline__ void q6k_mma_scales(u32 dx, u32 dy, float (&dw)[2], float (&dm)[2]) {
  dw[0] = h2f((u16)dx);
  dw[1] = h2f((u16)dy);
  dm[0] = dm[1] = 0.f;
}

// One superblock's integer sums of rows x = g, y = g + 8 against activation rows 2t (e = 0, 2)
// and 2t + 1 (e = 1, 3); `a`: activation row g at the superblock's first value; `v0`, `v1`: the
// chunk sums of rows 2t and 2t + 1 from the superblock's first chunk. Also the scales.
__device__ __forceinline__ void q8k_sb(const Q8kSb<T_Q4_K>& x, const Q8kSb<T_Q4_K>& y, const i8* a, const int* v0,
                                       const int* v1, int t, int (&is)[4], int (&ms)[4], float (&dw)[2],
                                       float (&dm)[2]) {
  const u32 M = 0x0F0F0F0Fu;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    int p = j >> 1, sh = (j & 1) * 4;
    uint2 b = *(const uint2*)(a + j * 32 + 8 * t);
    int d[4];
    mma_s8_k32(d, (x.q[p].x >> sh) & M, (y.q[p].x >> sh) & M, (x.q[p].y >> sh) & M, (y.q[p].y >> sh) & M, b.x, b.y);
    q4k_mma_acc(x.h, y.h, j, d, v0[j], v1[j], is, ms);
  }
  q4k_mma_scales(x.h, y.h, dw, dm);
}
__device__ __forceinline__ void q8k_sb(const Q8kSb<T_Q6_K>& x, const Q8kSb<T_Q6_K>& y, const i8* a, const int* v0,
                                       const int* v1, int t, int (&is)[4], int (&ms)[4], float (&dw)[2],
                                       float (&dm)[2]) {
#pragma unroll
  for (int c = 0; c < 8; c++) {
    int hf = c >> 2, g = c & 3, lsh = (g >> 1) * 4, hsh = 2 * g, li = 4 * hf + (g & 1) * 2;
    const i8* ab = a + c * 32;
    u32 b0 = *(const u32*)(ab + 4 * t), b1 = *(const u32*)(ab + 16 + 4 * t);
    int lo[4], hi[4];
    mma_s8_k16(lo, q6_bytes(x.l[li], x.hb[2 * hf], lsh, hsh), q6_bytes(y.l[li], y.hb[2 * hf], lsh, hsh), b0);
    mma_s8_k16(hi, q6_bytes(x.l[li + 1], x.hb[2 * hf + 1], lsh, hsh), q6_bytes(y.l[li + 1], y.hb[2 * hf + 1], lsh, hsh), b1);
    q6k_mma_acc(x.sc[2 * hf + (g >> 1)] >> (16 * (g & 1)), y.sc[2 * hf + (g >> 1)] >> (16 * (g & 1)), lo, hi, is);
  }
  q6k_mma_scales(x.d, y.d, dw, dm);
}

__device__ __forceinline__ void q8k_sb(const Q8kSb<T_Q4_KR>& x, const Q8kSb<T_Q4_KR>& y, const i8* a, const int* v0,
                                       const int* v1, int t, int (&is)[4], int (&ms)[4], float (&dw)[2],
                                       float (&dm)[2]) {
  const u32 M = 0x0F0F0F0Fu;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    u32 b0 = *(const u32*)(a + j * 32 + 4 * t), b1 = *(const u32*)(a + j * 32 + 16 + 4 * t);
    int d[4];
    mma_s8_k32(d, x.q[j] & M, y.q[j] & M, (x.q[j] >> 4) & M, (y.q[j] >> 4) & M, b0, b1);
    q4k_mma_acc(x.h, y.h, j, d, v0[j], v1[j], is, ms);
  }
  q4k_mma_scales(x.h, y.h, dw, dm);
}
__device__ __forceinline__ void q8k_sb(const Q8kSb<T_Q6_KR>& x, const Q8kSb<T_Q6_KR>& y, const i8* a, const int* v0,
                                       const int* v1, int t, int (&is)[4], int (&ms)[4], float (&dw)[2],
                                       float (&dm)[2]) {
#pragma unroll
  for (int j = 0; j < 8; j++) {
    u32 b0 = *(const u32*)(a + j * 32 + 4 * t), b1 = *(const u32*)(a + j * 32 + 16 + 4 * t);
    int lo[4], hi[4];
    // Values 4t.. : low nibbles of word t, bits 2t of high word 0; 16 + 4t.. : high nibbles, word 1.
    mma_s8_k16(lo, q6_bytes(x.l[j], x.hb[2 * j], 0, 2 * t), q6_bytes(y.l[j], y.hb[2 * j], 0, 2 * t), b0);
    mma_s8_k16(hi, q6_bytes(x.l[j], x.hb[2 * j + 1], 4, 2 * t), q6_bytes(y.l[j], y.hb[2 * j + 1], 4, 2 * t), b1);
    q6k_mma_acc(x.sc[j], y.sc[j], lo, hi, is);
  }
  q6k_mma_scales(x.d, y.d, dw, dm);
}

// The NS warps' streams of a tile summed in the single-row kernel's order, NS = 4:
// (S0 + S2) + (S1 + S3); NS = 8: ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)); warp 0 stores.
template <int NS>
__device__ __forceinline__ void q8k_reduce_store(float (&red)[NS][4][32], const float (&acc)[4], int r0, int rows,
                                                 int B, float* out) {
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; e++) red[wp][e][lane] = acc[e];
  __syncthreads();
  if (wp == 0) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v;
      if (NS == 4) {
        v = __fadd_rn(__fadd_rn(red[0][e][lane], red[2][e][lane]), __fadd_rn(red[1][e][lane], red[3][e][lane]));
      } else {
        float a = __fadd_rn(__fadd_rn(red[0][e][lane], red[4][e][lane]), __fadd_rn(red[2][e][lane], red[6][e][lane]));
        float b = __fadd_rn(__fadd_rn(red[1][e][lane], red[5][e][lane]), __fadd_rn(red[3][e][lane], red[7][e][lane]));
        v = __fadd_rn(a, b);
      }
      int r = r0 + g + (e >> 1) * 8, b = 2 * t + (e & 1);
      if (r < rows && b < B) out[(u64)b * rows + r] = v;
    }
  }
}

// Superblock s of rows x, y (loaded) added to the streams' sums of activation rows b0, b1.
template <int T>
__device__ __forceinline__ void q8k_sb_add(const Q8kSb<T>& x, const Q8kSb<T>& y, const i8* arow, const int* bs0,
                                           const int* bs1, const float* dk, int b0, int b1, int nsb, int s, int t,
                                           float (&acc)[4]) {
  int is[4] = {0, 0, 0, 0}, ms[4] = {0, 0, 0, 0};
  float dw[2], dm[2];
  q8k_sb(x, y, arow + s * 256, bs0 + s * 8, bs1 + s * 8, t, is, ms, dw, dm);
  float da0 = dk[b0 * nsb + s], da1 = dk[b1 * nsb + s];
  constexpr int G = q8k_gguf(T);
  acc[0] = __fadd_rn(acc[0], q8k_term<G>(dw[0], dm[0], da0, is[0], ms[0]));
  acc[1] = __fadd_rn(acc[1], q8k_term<G>(dw[0], dm[0], da1, is[1], ms[1]));
  acc[2] = __fadd_rn(acc[2], q8k_term<G>(dw[1], dm[1], da0, is[2], ms[2]));
  acc[3] = __fadd_rn(acc[3], q8k_term<G>(dw[1], dm[1], da1, is[3], ms[3]));
}

// 16 weight rows x 8 activation rows a block of NS warps; warp g takes the superblocks s = g mod NS
// (stream g), loading the next one's weights before this one's arithmetic. The chunk dots come from
// mma.sync (s8, s32: exact); thread (g, t) holds D[g][2t], D[g][2t + 1], D[g + 8][2t], D[g + 8][2t + 1].
// Activation rows past B repeat row B - 1. out is [B][rows].
template <int T, int NS>
__device__ void q8k_mma_t(const u8* w, u64 row_bytes, int rows, int cols, const i8* aq, const float* dk,
                          const int* bs, int B, float* out) {
  __shared__ float red[NS][4][32];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int r0 = blockIdx.x * 16;
  const u8* X = w + (u64)min(r0 + g, rows - 1) * row_bytes;
  const u8* Y = w + (u64)min(r0 + g + 8, rows - 1) * row_bytes;
  int b0 = min(2 * t, B - 1), b1 = min(2 * t + 1, B - 1), ag = min(g, B - 1);
  int nsb = cols / 256, nch = cols / 32;
  const i8* arow = aq + (u64)ag * cols;
  const int* bs0 = bs + (u64)b0 * nch;
  const int* bs1 = bs + (u64)b1 * nch;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  Q8kSb<T> nx = {}, ny = {};
  if (wp < nsb) {
    q8k_load(nx, X, wp, t, nch);
    q8k_load(ny, Y, wp, t, nch);
  }
  for (int s = wp; s < nsb; s += NS) {
    Q8kSb<T> x = nx, y = ny;
    if (s + NS < nsb) {
      q8k_load(nx, X, s + NS, t, nch);
      q8k_load(ny, Y, s + NS, t, nch);
    }
    q8k_sb_add<T>(x, y, arow, bs0, bs1, dk, b0, b1, nsb, s, t, acc);
  }
  q8k_reduce_store<NS>(red, acc, r0, rows, B, out);
}

#define Q8K_KERNELS(SUF, T)                                                                                       \
  extern "C" __global__ void __launch_bounds__(128) q8k_matvec_##SUF(const u8* w, u64 rb, int rows, int cols,   \
                                                                     const i8* aq, const float* dk, const int* bs, \
                                                                     float* out) {                               \
    q8k_matvec_t<T, 4>(w, rb, rows, cols, aq, dk, bs, out);                                                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(128) q8k_matvec8_##SUF(const u8* w, u64 rb, int rows, int cols,  \
                                                                      const i8* aq, const float* dk, const int* bs, \
                                                                      float* out) {                              \
    q8k_matvec_t<T, 8>(w, rb, rows, cols, aq, dk, bs, out);                                                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(128) q8k_mma_##SUF(const u8* w, u64 rb, int rows, int cols,      \
                                                                  const i8* aq, const float* dk, const int* bs,   \
                                                                  int B, float* out) {                           \
    q8k_mma_t<T, 4>(w, rb, rows, cols, aq, dk, bs, B, out);                                                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256) q8k_mma8_##SUF(const u8* w, u64 rb, int rows, int cols,     \
                                                                   const i8* aq, const float* dk, const int* bs,  \
                                                                   int B, float* out) {                          \
    q8k_mma_t<T, 8>(w, rb, rows, cols, aq, dk, bs, B, out);                                                      \
  }
Q8K_KERNELS(q4k, T_Q4_K)
Q8K_KERNELS(q6k, T_Q6_K)
Q8K_KERNELS(q4kr, T_Q4_KR)
Q8K_KERNELS(q6kr, T_Q6_KR)

// Q4_KR through shared memory (not yet run on a GPU): each warp copies its superblock of the 16
// rows (16 x 144 bytes) with coalesced 16-byte loads, the next one's loads in flight during this
// one's arithmetic, then reads the MMA fragments from there (a 144-byte row pitch: the quads'
// words fall in 32 different banks). Same sums and order as q8k_mma_t<T_Q4_KR, NS>.
template <int NS>
__device__ void q8k_mmas_q4kr_t(const u8* w, u64 row_bytes, int rows, int cols, const i8* aq, const float* dk,
                                const int* bs, int B, float* out) {
  __shared__ __align__(16) u8 st[NS][16 * 144];
  __shared__ float red[NS][4][32];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int r0 = blockIdx.x * 16;
  int b0 = min(2 * t, B - 1), b1 = min(2 * t + 1, B - 1), ag = min(g, B - 1);
  int nsb = cols / 256, nch = cols / 32;
  const i8* arow = aq + (u64)ag * cols;
  const int* bs0 = bs + (u64)b0 * nch;
  const int* bs1 = bs + (u64)b1 * nch;
  u8* mine = st[wp];
  // Pieces lane + 32i (i < 5) of the 144 16-byte pieces of a superblock's 16 rows.
  int4 nx[5];
  auto load = [&](int s) {
#pragma unroll
    for (int i = 0; i < 5; i++) {
      int idx = lane + 32 * i;
      if (idx < 144) {
        int row = idx / 9, piece = idx % 9;
        nx[i] = *(const int4*)(w + (u64)min(r0 + row, rows - 1) * row_bytes + (u64)s * 144 + 16 * piece);
      }
    }
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (wp < nsb) load(wp);
  for (int s = wp; s < nsb; s += NS) {
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 5; i++) {
      int idx = lane + 32 * i;
      if (idx < 144) *(int4*)(mine + (idx / 9) * 144 + 16 * (idx % 9)) = nx[i];
    }
    __syncwarp();
    if (s + NS < nsb) load(s + NS);
    Q8kSb<T_Q4_KR> x, y;  // rows g and g + 8 of the staged copy: superblock 0 of a 144-byte row
    q8k_load(x, mine + g * 144, 0, t, 8);
    q8k_load(y, mine + (g + 8) * 144, 0, t, 8);
    q8k_sb_add<T_Q4_KR>(x, y, arow, bs0, bs1, dk, b0, b1, nsb, s, t, acc);
  }
  q8k_reduce_store<NS>(red, acc, r0, rows, B, out);
}
extern "C" __global__ void __launch_bounds__(128) q8k_mmas_q4kr(const u8* w, u64 rb, int rows, int cols, const i8* aq,
                                                                const float* dk, const int* bs, int B, float* out) {
  q8k_mmas_q4kr_t<4>(w, rb, rows, cols, aq, dk, bs, B, out);
}
extern "C" __global__ void __launch_bounds__(256) q8k_mmas8_q4kr(const u8* w, u64 rb, int rows, int cols, const i8* aq,
                                                                 const float* dk, const int* bs, int B, float* out) {
  q8k_mmas_q4kr_t<8>(w, rb, rows, cols, aq, dk, bs, B, out);
}

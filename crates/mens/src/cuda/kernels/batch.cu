// ---------------------------------------------------------------------------------------------
// Batched decode (the server's step): B sequences, one new token each, at their own positions and
// in their own cache slots. The matrix kernels read each weight chunk once for all B activation
// rows (in tiles of up to 8 rows, the row's bytes staying in L1/L2 between tiles), so a step costs
// about one pass over the weights whatever B is, until the dp4a arithmetic is the limit.
// Rows of a batch: per-row arrays pos[b] (tokens before this one; -1 marks padding, which writes no
// cache and whose outputs are ignored) and slot[b] (cache slot; slot_stride values apart).
// The dp4a step's graph uses programmatic dependent launch (cuda/batch.rs): every kernel here
// calls pdl_wait() before it reads anything, and the matrix kernels pdl_trigger() once their last
// tile's dots are done, so the next kernel's blocks are placed during their tail.

// A tile: R weight rows of one type against N activation rows b0 .. b0 + N - 1. Rows past B load
// row B - 1 again (their sums are never written), so the loads need no branch and the compiler
// issues all of a chunk's N activation loads before its first dp4a: with a branch per row it waited
// on each row's load in turn. Each activation chunk loaded serves all R weight rows. A row's sum
// keeps the matrix-vector kernel's order (lane l takes chunks l, l + 32, ..., then warp_sum; for a
// split matrix matvec2's 64 streams), so a batch row gets the bits it gets alone, whatever N and R.
__device__ __forceinline__ u64 act_row(int b0, int j, int B) {
  int b = b0 + j;
  return (u64)(b < B ? b : B - 1);
}

#ifndef ACT_G
#define ACT_G 4
#endif
// acc[i][j] += chunk c of weight row i (unpacked in w) . activation row b0 + j.
template <int T, int N, int R>
__device__ __forceinline__ void dot_w(const W32 (&w)[R], int c, const i8* __restrict__ aq,
                                      const float2* __restrict__ ad, int cols, int b0, int B, float (&acc)[R][N]) {
  int nchunks = cols / 32;
  // Activation rows in groups of G, each group's loads issued together (all 8 at once left too
  // few registers for the next chunk's weights).
  constexpr int G = N < ACT_G ? N : ACT_G;
#pragma unroll
  for (int j0 = 0; j0 < N; j0 += G) {
    int4 a0[G], a1[G];
    float2 ds[G];
#pragma unroll
    for (int j = 0; j < G; j++) {
      u64 b = act_row(b0, j0 + j, B);
      const int4* ap = (const int4*)(aq + b * cols + c * 32);
      a0[j] = ap[0];
      a1[j] = ap[1];
      ds[j] = ad[b * nchunks + c];
    }
#pragma unroll
    for (int j = 0; j < G; j++)
#pragma unroll
      for (int i = 0; i < R; i++)
        acc[i][j0 + j] += finish<T>(w[i], dot16(w[i].q, a0[j]), dot16(w[i].q + 4, a1[j]), ds[j].x, ds[j].y);
  }
}

// acc[i][j] += chunk c of weight row i . activation row b0 + j.
template <int T, int N, int R>
__device__ __forceinline__ void dot_tile(const u8* const (&rows)[R], int c, const i8* __restrict__ aq,
                                         const float2* __restrict__ ad, int cols, int b0, int B,
                                         float (&acc)[R][N]) {
  int nchunks = cols / 32;
  W32 w[R];
  bool ok = true;
#pragma unroll
  for (int i = 0; i < R; i++) ok = unpack32<T>(rows[i], c, w[i], nchunks);
  if (ok) {
    dot_w<T, N, R>(w, c, aq, ad, cols, b0, B, acc);
  } else {  // float weights: one activation row at a time (unrolled, they took 168 registers)
#pragma unroll 1
    for (int j = 0; j < N; j++) {
      u64 b = act_row(b0, j, B);
      int a[8];
      const int4* ap = (const int4*)(aq + b * cols + c * 32);
      int4 a0 = ap[0], a1 = ap[1];
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
      a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
      float2 ds = ad[b * nchunks + c];
#pragma unroll
      for (int i = 0; i < R; i++) {
        float v = dot32<T>(rows[i], c, a, ds.x, ds.y, nchunks);
#pragma unroll
        for (int k = 0; k < N; k++)  // acc[i][j] += v, with acc kept in registers
          if (k == j) acc[i][k] += v;
      }
    }
  }
}

// One warp: the dots of R weight rows with activation rows b0 .. b0 + N - 1, summed over the warp
// (every lane gets them).
// With `step` 64 (split matrices: matvec2's order) the warp takes chunks 64 i + off + lane and
// leaves its lanes' sums unreduced.
template <int T, int N, int R, bool PF>
__device__ void tile_dots_t(const u8* const (&rows)[R], int cols, const i8* __restrict__ aq,
                            const float2* __restrict__ ad, int b0, int B, float (&acc)[R][N], int off = 0,
                            int step = 32) {
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int j = 0; j < N; j++) acc[i][j] = 0.f;
  int lane = threadIdx.x & 31, nchunks = cols / 32;
#ifndef NO_PF
  if (PF && int_form(T)) {  // each row's next chunk loaded before this one's arithmetic (see Raw)
    Raw<T> r[R];
    if (lane + off < nchunks)
#pragma unroll
      for (int i = 0; i < R; i++) raw_load<T>(r[i], rows[i], lane + off, nchunks);
    for (int c = lane + off; c < nchunks; c += step) {
      W32 w[R];
#pragma unroll
      for (int i = 0; i < R; i++) raw_unpack<T>(r[i], w[i]);
      if (c + step < nchunks)
#pragma unroll
        for (int i = 0; i < R; i++) raw_load<T>(r[i], rows[i], c + step, nchunks);
      dot_w<T, N, R>(w, c, aq, ad, cols, b0, B, acc);
    }
  } else
#endif
    for (int c = lane + off; c < nchunks; c += step) dot_tile<T, N, R>(rows, c, aq, ad, cols, b0, B, acc);
  if (step != 32) return;
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int j = 0; j < N; j++) acc[i][j] = warp_sum(acc[i][j]);
}
// TT >= 0: the rows are of type TT (a kernel per type, with its own registers: 5.55 against 6.32
// ms for the 7B's verify of 8); -1: any type. -DPF_BATCH loads TT's next chunk ahead, as the
// decode kernels do: slower here (7B verify of 8 in 6.37 ms: the tile's registers spilled).
#ifdef PF_BATCH
#define PF_TT true
#else
#define PF_TT false
#endif
template <int N, int R, int TT>
__device__ void tile_dots(int type, const u8* const (&rows)[R], int cols, const i8* aq, const float2* ad, int b0,
                          int B, float (&acc)[R][N], int off = 0, int step = 32) {
  if (TT >= 0) {
    tile_dots_t<TT < 0 ? 0 : TT, N, R, PF_TT>(rows, cols, aq, ad, b0, B, acc, off, step);
    return;
  }
  switch (type) {
    case T_Q4_K: tile_dots_t<T_Q4_K, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q6_K: tile_dots_t<T_Q6_K, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q4_KR: tile_dots_t<T_Q4_KR, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q6_KR: tile_dots_t<T_Q6_KR, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q5_0R: tile_dots_t<T_Q5_0R, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q8_0R: tile_dots_t<T_Q8_0R, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q5_0: tile_dots_t<T_Q5_0, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q8_0: tile_dots_t<T_Q8_0, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q4_0: tile_dots_t<T_Q4_0, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q4_1: tile_dots_t<T_Q4_1, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q5_1: tile_dots_t<T_Q5_1, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_Q5_K: tile_dots_t<T_Q5_K, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_F16: tile_dots_t<T_F16, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    case T_BF16: tile_dots_t<T_BF16, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
    default: tile_dots_t<T_F32, N, R, false>(rows, cols, aq, ad, b0, B, acc, off, step); break;
  }
}

// acc[i][j] for lane i * N + j (0 when no such pair), without indexing registers by a variable.
template <int N, int R>
__device__ __forceinline__ float pick(const float (&acc)[R][N], int l) {
  float v = 0.f;
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int j = 0; j < N; j++)
      if (i * N + j == l) v = acc[i][j];
  return v;
}

// Global row r of up to three stacked matrices: its segment and its row within it.
__device__ __forceinline__ const u8* seg_row(const Seg& s0, const Seg& s1, const Seg& s2, int r, int* type) {
  if (r < s0.rows) {
    *type = s0.type;
    return s0.w + (u64)r * s0.row_bytes;
  }
  r -= s0.rows;
  if (r < s1.rows) {
    *type = s1.type;
    return s1.w + (u64)r * s1.row_bytes;
  }
  r -= s1.rows;
  *type = s2.type;
  return s2.w + (u64)r * s2.row_bytes;
}

// acc[0], acc[1]: the dots of weight rows ra (type ta) and rb (type tb) with activation rows
// b0 .. b0 + N - 1, through one tile when the types agree, else one row at a time (rb not at all
// without `two`).
template <int N, int TT>
__device__ __forceinline__ void pair_dots(int ta, const u8* ra, int tb, const u8* rb, bool two, int cols,
                                          const i8* aq, const float2* ad, int b0, int B, float (&acc)[2][N],
                                          int off = 0, int step = 32) {
  if (TT >= 0 || ta == tb) {  // a typed kernel's rows are all of its type (Device::one_type)
    const u8* rows[2] = {ra, rb};
    tile_dots<N, 2, TT>(ta, rows, cols, aq, ad, b0, B, acc, off, step);
    return;
  }
  const u8* ea[1] = {ra};
  float x[1][N];
  tile_dots<N, 1, -1>(ta, ea, cols, aq, ad, b0, B, x, off, step);
#pragma unroll
  for (int j = 0; j < N; j++) acc[0][j] = x[0][j];
  if (two) {
    const u8* eb[1] = {rb};
    tile_dots<N, 1, -1>(tb, eb, cols, aq, ad, b0, B, x, off, step);
  }
#pragma unroll
  for (int j = 0; j < N; j++) acc[1][j] = x[0][j];
}

// out[orow[b] * ldo + r] (+)= W[r] . a[b] (+ bias[r]) for the rows of up to three stacked matrices
// and activation rows b < B (orow null: row b); mode bit 0: add (the residual) instead of store.
// One warp per pair of weight rows (both through one tile when they have one type), 4 warps per
// block (8 rows); activation rows in tiles of N (N = 1, 2, 4, 8: the batch's size, up to 8). Mode
// bit 1 (split, one matrix): two warps a pair, 4 rows a block, in matvec2's 64 streams, so a batch
// row gets the bits decoding gives it with matvec2.
template <int N, int TT>
__device__ void matmul_q8_t(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B, float* out,
                            int ldo, const int* orow, const float* bias, int mode) {
  __shared__ float part[2][2][N][32];
  pdl_wait();
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bool split = mode & 2;
  int h = split ? w & 1 : 0, p = split ? w >> 1 : 0;
  int r = split ? (blockIdx.x * 2 + p) * 2 : (blockIdx.x * 4 + w) * 2;
  int total = s0.rows + s1.rows + s2.rows;
  if (!split && r >= total) return;
  bool live = r < total, two = r + 1 < total;
  int ta, tb = -1;
  const u8* ra = seg_row(s0, s1, s2, min(r, total - 1), &ta);
  const u8* rb = two ? seg_row(s0, s1, s2, r + 1, &tb) : ra;
  float bva = bias && live ? bias[r] : 0.f, bvb = bias && two ? bias[r + 1] : 0.f;
  for (int b0 = 0; b0 < B; b0 += N) {
    float acc[2][N];
    if (split) {
      pair_dots<N, TT>(ta, ra, tb, rb, two, cols, aq, ad, b0, B, acc, 32 * h, 64);
      if (b0 + N >= B) pdl_trigger();
      // Streams l and l + 32 (warp 1's lane l), then warp_sum's tree: matvec2's sum.
      if (h)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
          for (int j = 0; j < N; j++) part[p][i][j][lane] = acc[i][j];
      __syncthreads();
      if (!h)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
          for (int j = 0; j < N; j++) acc[i][j] = warp_sum(acc[i][j] + part[p][i][j][lane]);
      __syncthreads();
      if (h || !live) continue;
    } else {
      pair_dots<N, TT>(ta, ra, tb, rb, two, cols, aq, ad, b0, B, acc);
      if (b0 + N >= B) pdl_trigger();
    }
    // Lane i * N + j writes weight row r + i, activation row b0 + j.
    int i = lane / N, b = b0 + lane % N;
    if (lane < 2 * N && b < B && (i == 0 || two)) {
      float v = pick<N, 2>(acc, lane) + (i ? bvb : bva);
      float* o = out + (u64)(orow ? orow[b] : b) * ldo + r + i;
      *o = (mode & 1) ? *o + v : v;
    }
  }
}

// The typed kernels take GLU_RP gate/up pairs a warp in one tile: each activation chunk loaded once
// for 2 * GLU_RP weight rows. 2: the 7B's verify of 8 in 4.88-4.89 ms against 5.22-5.24 with 1, of 1
// in 2.35-2.36 against 2.72-2.74 (H200, docs/benchmarks.md, session 33); 4 was slower (6.68; with one
// block an SM 5.94), and so were 4 rows a warp in the matmuls (5.56). The same bits whatever GLU_RP.
#ifndef GLU_RP
#define GLU_RP 2
#endif
static_assert(GLU_RP == 1 || GLU_RP == 2 || GLU_RP == 4, "GLU_RP: 1, 2 or 4 pairs a warp");
// h[b] = silu(gate . a[b]) * (up . a[b]), quantized to q8 (hq [B][f], hd [B][f / 32]): a block of
// 8 warps makes 32 rows (one q8 block of every h[b]), each warp a gate and an up row (one tile when
// they have one type) four times, or GLU_RP pairs at once 4 / GLU_RP times (the typed kernels).
template <int N, int TT>
__device__ void glu_q8_t(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, int B, i8* hq, float2* hd,
                         const float* ns) {
  __shared__ float h[N][32];
  pdl_wait();
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int f = gate.rows;
  for (int b0 = 0; b0 < B; b0 += N) {
#if GLU_RP > 1
    if (TT >= 0) {  // GLU_RP pairs a warp in one tile: each activation chunk loaded once for them all
      for (int k = 0; k < 4; k += GLU_RP) {
        const u8* rows[2 * GLU_RP];
        float acc[2 * GLU_RP][N];
#pragma unroll
        for (int p = 0; p < GLU_RP; p++) {
          int r = blockIdx.x * 32 + 8 * (k + p) + w;
          rows[2 * p] = gate.w + (u64)r * gate.row_bytes;
          rows[2 * p + 1] = up.w + (u64)r * up.row_bytes;
        }
        tile_dots<N, 2 * GLU_RP, TT>(gate.type, rows, cols, aq, ad, b0, B, acc);
        if (lane < N)
#pragma unroll
          for (int p = 0; p < GLU_RP; p++) {
            float sc = ns ? ns[min(b0 + lane, B - 1)] : 1.f;
            float x = __fmul_rn(pick<N, 2 * GLU_RP>(acc, 2 * p * N + lane), sc);
            float y = __fmul_rn(pick<N, 2 * GLU_RP>(acc, (2 * p + 1) * N + lane), sc);
            h[lane][8 * (k + p) + w] = x / (1.f + expf(-x)) * y;
          }
      }
    } else
#endif
      for (int k = 0; k < 4; k++) {
        int rr = 8 * k + w, r = blockIdx.x * 32 + rr;
        const u8* g = gate.w + (u64)r * gate.row_bytes;
        const u8* u = up.w + (u64)r * up.row_bytes;
        float acc[2][N];
        pair_dots<N, TT>(gate.type, g, up.type, u, true, cols, aq, ad, b0, B, acc);
        if (lane < N) {
          float sc = ns ? ns[min(b0 + lane, B - 1)] : 1.f;
          float x = __fmul_rn(pick<N, 2>(acc, lane), sc), y = __fmul_rn(pick<N, 2>(acc, N + lane), sc);
          h[lane][rr] = x / (1.f + expf(-x)) * y;
        }
      }
    __syncthreads();
    if (b0 + N >= B) pdl_trigger();
    if (w < N && b0 + w < B) quant_lane(h[w][lane], hq + (u64)(b0 + w) * f + blockIdx.x * 32, hd + (u64)(b0 + w) * (f / 32) + blockIdx.x);
    __syncthreads();
  }
}

// Q/K/V for B rows: the three matrices stacked, bias, RoPE at pos[b], K and V into cache slot
// slot[b] (slot_stride bytes apart; with kc = 0, a quantized cache: K and V as f32 into their
// places in qkv [B][row], which the attention kernel stores), Q (rounded to f16) into
// q [B][n_head * hd]. One warp per pair of rows that RoPE rotates together (see qkv_rope), both
// through one tile.
template <int N>
__device__ void qkv_rope_t(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B,
                           const float* bias, const float* cosv, const float* sinv, const int* pos,
                           const int* slot, const int* pages, int max_pages, u64 page_bytes, int n_head,
                           int n_kv_head, int hd, int neox, float* q, u8* kc8, u8* vc8, float* qkv,
                           const float* ns) {
  pdl_wait();
  int half = hd / 2;
  int p = blockIdx.x * 4 + (threadIdx.x >> 5);
  int heads = n_head + 2 * n_kv_head;
  if (p >= heads * half) return;
  int h = p / half, k = p % half;
  int ra = h * hd + (neox ? k : 2 * k), rb = h * hd + (neox ? k + half : 2 * k + 1);
  int type, type_b;
  const u8* rows[2];
  rows[0] = seg_row(s0, s1, s2, ra, &type);
  rows[1] = seg_row(s0, s1, s2, rb, &type_b);  // the same matrix: a head is in one
  int lane = threadIdx.x & 31, kvd = n_kv_head * hd, qd = n_head * hd;
  float ba = bias ? bias[ra] : 0.f, bb = bias ? bias[rb] : 0.f;
  for (int b0 = 0; b0 < B; b0 += N) {
    float x[2][N];
    tile_dots<N, 2, -1>(type, rows, cols, aq, ad, b0, B, x);
    if (b0 + N >= B) pdl_trigger();
    int b = b0 + lane;
    if (lane >= N || b >= B) continue;
    float sc = ns ? ns[b] : 1.f;  // a deferred norm's scale (no FMA with the bias: decode's bits)
    float x0 = __fmul_rn(pick<N, 2>(x, lane), sc) + ba, x1 = __fmul_rn(pick<N, 2>(x, N + lane), sc) + bb;
    int ps = pos[b];
    if (ps < 0) continue;  // padding
    const int* pt = pages + slot[b] * max_pages;
    u16* kc = (u16*)kv_at(kc8, pt, page_bytes, ps, 2 * kvd);
    u16* vc = (u16*)kv_at(vc8, pt, page_bytes, ps, 2 * kvd);
    float* st = qkv + (u64)b * (qd + 2 * kvd);
    if (h < n_head + n_kv_head) {
      float c = cosv[(u64)ps * half + k], sn = sinv[(u64)ps * half + k];
      float2 y = rope_rot(x0, x1, c, sn);
      float y0 = y.x, y1 = y.y;
      if (h < n_head) {
        q[(u64)b * qd + ra] = h2f(f2h(y0));
        q[(u64)b * qd + rb] = h2f(f2h(y1));
      } else if (!kc8) {
        st[ra] = y0;
        st[rb] = y1;
      } else {
        u64 o = (h - n_head) * hd;
        kc[o + ra - h * hd] = f2h(y0);
        kc[o + rb - h * hd] = f2h(y1);
      }
    } else if (!vc8) {
      st[ra] = x0;
      st[rb] = x1;
    } else {
      u64 o = (h - n_head - n_kv_head) * hd;
      vc[o + ra - h * hd] = f2h(x0);
      vc[o + rb - h * hd] = f2h(x1);
    }
  }
}

// One kernel of each per tile size N (the batch size up to 8; 8 beyond), each with its own registers.
// Blocks an SM the registers are sized for (tuning: -DQ8_MINB=, -DGLU_MINB=).
#ifndef Q8_MINB
#define Q8_MINB 4
#endif
#ifndef GLU_MINB
#define GLU_MINB 2
#endif
#define DP4A_KERNELS(N)                                                                                 \
  extern "C" __global__ void __launch_bounds__(128, Q8_MINB)                                                 \
      matmul_q8_##N(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B, float* out, \
                    int ldo, const int* orow, const float* bias, int mode) {                           \
    matmul_q8_t<N, -1>(s0, s1, s2, cols, aq, ad, B, out, ldo, orow, bias, mode);                           \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256, GLU_MINB)                                                 \
      glu_q8_b_##N(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, int B, i8* hq, float2* hd,   \
                   const float* ns) {                                                                   \
    glu_q8_t<N, -1>(gate, up, cols, aq, ad, B, hq, hd, ns);                                                \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(128, Q8_MINB)                                                 \
      qkv_rope_b_##N(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B,          \
                     const float* bias, const float* cosv, const float* sinv, const int* pos,          \
                     const int* slot, const int* pages, int max_pages, u64 page_bytes, int n_head,     \
                     int n_kv_head, int hd, int neox, float* q, u8* kc8, u8* vc8, float* qkv,          \
                     const float* ns) {                                                                \
    qkv_rope_t<N>(s0, s1, s2, cols, aq, ad, B, bias, cosv, sinv, pos, slot, pages, max_pages,          \
                  page_bytes, n_head, n_kv_head, hd, neox, q, kc8, vc8, qkv, ns);                      \
  }
DP4A_KERNELS(1)
DP4A_KERNELS(2)
DP4A_KERNELS(4)
DP4A_KERNELS(8)
// The same for matrices all of one main type (Q4_K, Q6_K), each with its own registers.
#define DP4A_TYPED(N, SUF, T)                                                                           \
  extern "C" __global__ void __launch_bounds__(128, Q8_MINB)                                                 \
      matmul_q8_##N##_##SUF(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, int B,     \
                            float* out, int ldo, const int* orow, const float* bias, int mode) {       \
    matmul_q8_t<N, T>(s0, s1, s2, cols, aq, ad, B, out, ldo, orow, bias, mode);                         \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(256, GLU_MINB)                                                 \
      glu_q8_b_##N##_##SUF(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, int B, i8* hq,    \
                           float2* hd, const float* ns) {                                              \
    glu_q8_t<N, T>(gate, up, cols, aq, ad, B, hq, hd, ns);                                             \
  }
DP4A_TYPED(1, q4k, T_Q4_K)
DP4A_TYPED(2, q4k, T_Q4_K)
DP4A_TYPED(4, q4k, T_Q4_K)
DP4A_TYPED(8, q4k, T_Q4_K)
DP4A_TYPED(1, q6k, T_Q6_K)
DP4A_TYPED(2, q6k, T_Q6_K)
DP4A_TYPED(4, q6k, T_Q6_K)
DP4A_TYPED(8, q6k, T_Q6_K)
DP4A_TYPED(1, q4kr, T_Q4_KR)
DP4A_TYPED(2, q4kr, T_Q4_KR)
DP4A_TYPED(4, q4kr, T_Q4_KR)
DP4A_TYPED(8, q4kr, T_Q4_KR)
DP4A_TYPED(1, q6kr, T_Q6_KR)
DP4A_TYPED(2, q6kr, T_Q6_KR)
DP4A_TYPED(4, q6kr, T_Q6_KR)
DP4A_TYPED(8, q6kr, T_Q6_KR)
// The 0.5B's and other small models' main types (matrices of 896 columns cannot be K-quants), in
// their GPU layouts.
DP4A_TYPED(1, q5_0r, T_Q5_0R)
DP4A_TYPED(2, q5_0r, T_Q5_0R)
DP4A_TYPED(4, q5_0r, T_Q5_0R)
DP4A_TYPED(8, q5_0r, T_Q5_0R)
DP4A_TYPED(1, q8_0r, T_Q8_0R)
DP4A_TYPED(2, q8_0r, T_Q8_0R)
DP4A_TYPED(4, q8_0r, T_Q8_0R)
DP4A_TYPED(8, q8_0r, T_Q8_0R)

// Attention for B rows at their own lengths. Grid (n_kv_head * B * hgs, workers): block (b, kv
// head, head group) takes every workers-th split of row b's keys for hgs-th of the KV head's query
// heads (attn_decode_t); splits is the per-row stride of part_o / part_ml.
// Row b's cache is the pages of slot slot[b] (its row of the page table `pages`, max_pages
// wide). The output goes to o16 [B][q_dim] in f16 when o16 is set, else to aq/ad in q8.
template <int HD, int T>
__device__ void attn_decode_b(const float* q, u8* kc, u8* vc, const int* pos, const int* slot,
                              const int* pages, int max_pages, u64 page_bytes, int n_head, int n_kv_head,
                              float scale, int splits, float* part_o, float2* part_ml, u32* counters, i8* aq,
                              float2* ad, u16* o16, const float* qkv, int hgs) {
  pdl_wait();
  int hg = blockIdx.x % hgs, bk = blockIdx.x / hgs;
  int b = bk / n_kv_head, kvh = bk % n_kv_head;
  int p = pos[b];
  if (p < 0) return;
  int qd = n_head * HD;
  attn_decode_t<HD, T>(q + (u64)b * qd, kc, vc, p + 1, n_head, n_kv_head, scale,
                       part_o + (u64)b * splits * qd, part_ml + (u64)b * splits * n_head, counters + b * n_kv_head * hgs,
                       aq + (u64)b * qd, ad + (u64)b * (qd / 32), kvh, blockIdx.y, gridDim.y,
                       o16 ? o16 + (u64)b * qd : 0, qkv + (u64)b * (qd + 2 * n_kv_head * HD) + qd,
                       pages + slot[b] * max_pages, page_bytes, hg, hgs);
}
#define ATTN_DECODE_B(NAME, HD, T)                                                                          \
  extern "C" __global__ void NAME(const float* q, u8* kc, u8* vc, const int* pos, const int* slot,             \
                                  const int* pages, int max_pages, u64 page_bytes, int n_head, int n_kv_head, \
                                  float scale, int splits, float* part_o, float2* part_ml, u32* counters,     \
                                  i8* aq, float2* ad, u16* o16, const float* qkv, int hgs) {                  \
    attn_decode_b<HD, T>(q, kc, vc, pos, slot, pages, max_pages, page_bytes, n_head, n_kv_head, scale,        \
                         splits, part_o, part_ml, counters, aq, ad, o16, qkv, hgs);                           \
  }
ATTN_DECODE_B(attn_decode64_b, 64, T_F16)
ATTN_DECODE_B(attn_decode128_b, 128, T_F16)
ATTN_DECODE_B(attn_decode64_b_q8, 64, T_Q8_0)
ATTN_DECODE_B(attn_decode128_b_q8, 128, T_Q8_0)
ATTN_DECODE_B(attn_decode64_b_q4, 64, T_Q4_0)
ATTN_DECODE_B(attn_decode128_b_q4, 128, T_Q4_0)

// Greedy for B rows: grid (blocks, B); row b's logits are rows[orow[b]] (row stride n), its
// choice goes to ids[orow[b]] (padding rows too: their orow is a scratch row).
extern "C" __global__ void argmax_b(const float* x, int n, const int* orow, float2* partial, u32* counter,
                                    int* ids) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ bool last;
  pdl_wait();
  int b = blockIdx.y, o = orow[b];
  float v;
  int idx;
  am_block(x + (u64)o * n, n, v, idx, bv, bi);
  float2* pb = partial + (u64)b * gridDim.x;
  if (threadIdx.x == 0) {
    pb[blockIdx.x] = make_float2(v, __int_as_float(idx));
    __threadfence();
    last = atomicAdd(&counter[b], 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x < 32) {
    __threadfence();
    am_partials(pb, gridDim.x, v, idx);
    if (threadIdx.x == 0) {
      int r = idx;
      if (r < 0 || r >= n) r = 0;  // only when every logit is NaN
      ids[o] = r;
      counter[b] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core batched matmul (the server's decode step): weights dequantized in registers straight
// into f16 MMA fragments (mma.m16n8k16, f32 accumulation), activations in f16. Each weight block is
// read once per step for up to 64 activation rows, and no per-chunk scaling is left for after the
// MMA. Block: MT = 16 weight rows, KW = 8 warps splitting the row's 32-value chunks; a warp holds
// NT tiles of 8 activation rows. A row's result does not depend on the other rows in the batch,
// so N requests decoded together give the bits each gives alone.

#define MT 16
#define KW 8
// Tuning (MENS_CUDA_DEFINES="-DH16_MINB=.. -DH16_U=.."): blocks per SM the register budget is
// sized for, and chunks per warp per step (0: by tile count). The kernel waits on its weight
// loads: three blocks an SM (64-80 registers, not 90-118) took a 16-row 7B step from 1117 to 1777
// tokens/s on the H200 (docs/benchmarks.md, session 16).
#ifndef H16_MINB
#define H16_MINB 3
#endif
#ifndef H16_U
#define H16_U 0
#endif

__device__ __forceinline__ u32 pack2(float a, float b) { return (u32)f2h(a) | ((u32)f2h(b) << 16); }
__device__ __forceinline__ u32 byte_of(u32 lo, u32 hi, int i) { return ((i < 4 ? lo >> (8 * i) : hi >> (8 * (i - 4)))) & 0xff; }

// f in both halves of an f16 pair.
__device__ __forceinline__ u32 dup_h(float f) {
  u32 h = f2h(f);
  return h | (h << 16);
}

// The 8 unsigned bytes of x0 (values 0-3) and x1 (4-7) as f16 pairs (x - off) * d + m, where off
// holds 1024 + the zero point in both halves: a byte b placed under the f16 exponent of 1024 reads
// 1024 + b exactly, so the unpacking is a byte permute and two f16x2 operations per pair (the
// float path costs about three times as many instructions, and the matmul is bound by them).
__device__ __forceinline__ void deq4_h(u32 x0, u32 x1, u32 off, u32 d, u32 m, u32* h) {
  u32 p[4] = {__byte_perm(x0, 0x64646464u, 0x5140), __byte_perm(x0, 0x64646464u, 0x7362),
              __byte_perm(x1, 0x64646464u, 0x5140), __byte_perm(x1, 0x64646464u, 0x7362)};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    u32 v;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(v) : "r"(p[i]), "r"(off));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[i]) : "r"(v), "r"(d), "r"(m));
  }
}

// The 8 values 8t .. 8t+7 of chunk c of one weight row, as 4 f16 pairs, for thread t (0..3) of an
// MMA quad. The MMA's k order is a permutation of the chunk's values (thread t's k = 2t, 2t+1,
// 2t+8, 2t+9 of the lower MMA hold values 8t..8t+3, those of the upper one 8t+4..8t+7); the
// activations use the same permutation, so each thread reads 8 contiguous weights and 16
// contiguous activation bytes.
__device__ __forceinline__ void deq_frag(int type, const u8* row, int c, int t, u32* h, int n) {
  float v[8];
  switch (type) {
    case T_Q4_KR: {  // the Q4_K case's expressions, from the repacked chunk
      W32 w;
      unpack32<T_Q4_KR>(row, c, w, n);
      deq4_h((u32)w.q[2 * t], (u32)w.q[2 * t + 1], 0x64006400u, dup_h(w.a * (float)w.s0), dup_h(-w.b * (float)w.s1), h);
      return;
    }
    case T_Q6_KR: {  // the Q6_K case's: values back to 0..63 (unpack32 gives them less 32)
      W32 w;
      unpack32<T_Q6_KR>(row, c, w, n);
      u32 x0 = __vadd4((u32)w.q[2 * t], 0x20202020u), x1 = __vadd4((u32)w.q[2 * t + 1], 0x20202020u);
      deq4_h(x0, x1, 0x64206420u, dup_h(w.a * (float)((t >> 1) ? w.s1 : w.s0)), 0u, h);
      return;
    }
    case T_Q4_K:
    case T_Q5_K: {
      bool k5 = type == T_Q5_K;
      const u8* b = row + (c >> 3) * (k5 ? 176 : 144);
      int sub = c & 7, shift = (sub & 1) * 4;
      uint2 q = *(const uint2*)(b + (k5 ? 48 : 16) + (sub >> 1) * 32 + 8 * t);
      int4 hd = *(const int4*)b;  // d, dmin, scales[12]
      int sc, mn;
      q4k_scale_min(hd, sub, &sc, &mn);
      u32 x0 = (q.x >> shift) & 0x0F0F0F0Fu, x1 = (q.y >> shift) & 0x0F0F0F0Fu;
      if (k5) {
        uint2 qh = *(const uint2*)(b + 16 + 8 * t);
        x0 |= ((qh.x >> sub) & 0x01010101u) << 4;
        x1 |= ((qh.y >> sub) & 0x01010101u) << 4;
      }
      deq4_h(x0, x1, 0x64006400u, dup_h(h2f((u16)(hd.x & 0xffff)) * (float)sc),
             dup_h(-h2f((u16)((u32)hd.x >> 16)) * (float)mn), h);
      return;
    }
    case T_Q6_K: {
      const u8* b = row + (c >> 3) * 210;
      int sub = c & 7, n = sub >> 2, g = sub & 3;
      const u8* ql = b + n * 64 + (g & 1) * 32 + 8 * t;
      const u8* qh = b + 128 + n * 32 + 8 * t;
      u32 l0 = ld2(ql), l1 = ld2(ql + 4), h0 = ld2(qh), h1 = ld2(qh + 4);
      int lsh = (g >> 1) * 4, hsh = 2 * g;
      float d = h2f(*(const u16*)(b + 208)) * (float)((const i8*)(b + 192))[n * 8 + 2 * g + (t >> 1)];
      u32 x0 = ((l0 >> lsh) & 0x0F0F0F0Fu) | (((h0 >> hsh) & 0x03030303u) << 4);
      u32 x1 = ((l1 >> lsh) & 0x0F0F0F0Fu) | (((h1 >> hsh) & 0x03030303u) << 4);
      deq4_h(x0, x1, 0x64206420u, dup_h(d), 0u, h);  // (1024 + x) - (1024 + 32)
      return;
    }
    case T_Q8_0:
    case T_Q8_0R: {
      bool r = type == T_Q8_0R;  // the GPU layout: quants 32 a chunk, then the scales
      const u8* q = r ? row + 32 * c : row + c * 34 + 2;
      u32 q0 = ld2(q + 8 * t), q1 = ld2(q + 4 + 8 * t);
      float d = h2f(*(const u16*)(r ? row + 32 * n + 2 * c : row + c * 34));
#pragma unroll
      for (int i = 0; i < 8; i++) v[i] = d * (float)(i8)byte_of(q0, q1, i);
      break;
    }
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_0R:
    case T_Q5_1: {
      // Value j < 16: low nibble of byte j; j >= 16: high nibble of byte j - 16; Q5: bit j of qh.
      // Q5_0R (the GPU layout): the 16 quant bytes a chunk, then the qh words, then the scales.
      bool r = type == T_Q5_0R;
      int bs = type == T_Q4_0 ? 18 : type == T_Q4_1 ? 20 : type == T_Q5_0 ? 22 : 24;
      int qo = type == T_Q4_0 ? 2 : type == T_Q4_1 ? 4 : type == T_Q5_0 ? 6 : 8;
      const u8* b = row + c * bs;
      float d = h2f(*(const u16*)(r ? row + 20 * n + 2 * c : b));
      bool one = type == T_Q4_1 || type == T_Q5_1, five = type != T_Q4_0 && type != T_Q4_1;
      float m = one ? h2f(*(const u16*)(b + 2)) : (five ? -16.f * d : -8.f * d);
      u32 qh = r ? *(const u32*)(row + 16 * n + 4 * c)
                 : five ? (type == T_Q5_0 ? (u32)ld2(b + 2) : (u32)ld4(b + 4)) : 0;
      const u8* qs = (r ? row + 16 * c : b + qo) + 8 * (t & 1);
      u32 q0 = ld2(qs), q1 = ld2(qs + 4);
      int sh = 4 * (t >> 1);
#pragma unroll
      for (int i = 0; i < 8; i++) {
        u32 x = (byte_of(q0, q1, i) >> sh) & 15;
        if (five) x |= ((qh >> (8 * t + i)) & 1) << 4;
        v[i] = d * (float)x + m;
      }
      break;
    }
    case T_F16:
    case T_BF16: {
      uint4 x = *(const uint4*)((const u16*)row + c * 32 + 8 * t);
      u32 xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int p = 0; p < 4; p++)
        h[p] = type == T_F16 ? xs[p]
                             : pack2(__int_as_float((int)((xs[p] & 0xffff) << 16)), __int_as_float((int)(xs[p] & 0xffff0000u)));
      return;
    }
    default: {
      const float* w = (const float*)row + c * 32 + 8 * t;
#pragma unroll
      for (int i = 0; i < 8; i++) v[i] = w[i];
    }
  }
#pragma unroll
  for (int p = 0; p < 4; p++) h[p] = pack2(v[2 * p], v[2 * p + 1]);
}

// D (16 x 8, f32) += A (16 x 16 f16) . B (16 x 8 f16).
__device__ __forceinline__ void mma_f16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct RowRef {
  const u8* p;  // null: past the last row
  int type;
};
__device__ __forceinline__ RowRef row_ref(Seg s0, Seg s1, Seg s2, int r) {
  RowRef x = {0, 0};
  if (r < s0.rows) {
    x.p = s0.w + (u64)r * s0.row_bytes;
    x.type = s0.type;
  } else if ((r -= s0.rows) < s1.rows) {
    x.p = s1.w + (u64)r * s1.row_bytes;
    x.type = s1.type;
  } else if ((r -= s1.rows) < s2.rows) {
    x.p = s2.w + (u64)r * s2.row_bytes;
    x.type = s2.type;
  }
  return x;
}

// Partial sums of one 16-row tile for activation rows col0 .. col0 + 8 NT - 1 over chunks
// [cb0, cb1): the KW warps take chunks in turn, and their sums are added in warp order through
// shared memory; v[i][e] (for threads 0 .. 127 of the block, as `red` lays them out) gets the sum.
template <int NT>
__device__ __forceinline__ void mma_cols(RowRef ra, RowRef rb, int cols, const u16* __restrict__ x, int B, int col0,
                                         int cb0, int cb1, float* red) {
  // U chunks per warp per step: their loads are issued together, so a small batch (bound by memory
  // latency, not by the tensor cores) keeps more bytes in flight.
  constexpr int U = H16_U ? H16_U : NT == 1 ? 4 : NT == 2 ? 2 : 1;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int c0 = cb0 + w; c0 < cb1; c0 += KW * U) {
    u32 ha[U][4], hb[U][4];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int c = c0 + u * KW;
#pragma unroll
      for (int p = 0; p < 4; p++) ha[u][p] = hb[u][p] = 0;
      if (c < cb1 && ra.p) deq_frag(ra.type, ra.p, c, t, ha[u], cols / 32);
      if (c < cb1 && rb.p) deq_frag(rb.type, rb.p, c, t, hb[u], cols / 32);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int c = c0 + u * KW;
      if (c >= cb1) break;
#pragma unroll
      for (int i = 0; i < NT; i++) {
        int cb = col0 + i * 8 + g;  // this thread's activation row in the B fragment
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (cb < B) xv = *(const uint4*)(x + (u64)cb * cols + c * 32 + 8 * t);
        mma_f16(acc[i], ha[u][0], hb[u][0], ha[u][1], hb[u][1], xv.x, xv.y);
        mma_f16(acc[i], ha[u][2], hb[u][2], ha[u][3], hb[u][3], xv.z, xv.w);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < NT; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) red[((w * NT + i) * 4 + e) * 32 + lane] = acc[i][e];
  __syncthreads();
}

// out[orow[b] * ldo + r] (+)= W[r] . x[b] (+ bias[r]) for the rows of up to three stacked matrices
// and f16 activation rows b < B (orow null: row b); mode 0 stores, 1 adds. Grid: (rows / 16,
// splits); block: 32 * KW. grid.y splits the columns when there are too few row tiles to fill the
// GPU: each split writes partial sums to `part` ([split][B][rows]) and the last block of a row tile
// to finish (a ticket in `counters`, reset after) adds them in split order, so the result does not
// depend on timing. One kernel per tile count (B ≤ 8, 16, 32, any), each with its own registers.
template <int NT>
__device__ __forceinline__ void matmul_h16_t(Seg s0, Seg s1, Seg s2, int cols, const u16* x, int B, float* out,
                                             int ldo, const int* orow, const float* bias, int mode, float* part,
                                             u32* counters) {
  __shared__ float red[KW * NT * 4 * 32];
  __shared__ u32 last;
  int r0 = blockIdx.x * MT, total = s0.rows + s1.rows + s2.rows, splits = gridDim.y;
  int nchunks = cols / 32, per = (nchunks + splits - 1) / splits;
  int cb0 = blockIdx.y * per, cb1 = min(nchunks, cb0 + per);
  int g = (threadIdx.x & 31) >> 2;
  RowRef ra = row_ref(s0, s1, s2, r0 + g), rb = row_ref(s0, s1, s2, r0 + g + 8);
  for (int col0 = 0; col0 < B; col0 += 8 * NT) {
    mma_cols<NT>(ra, rb, cols, x, B, col0, cb0, cb1, red);
    for (int k = threadIdx.x; k < NT * 4 * 32; k += blockDim.x) {
      int i = k / 128, e = (k / 32) % 4, l = k % 32;
      float v = 0.f;
#pragma unroll
      for (int q = 0; q < KW; q++) v += red[((q * NT + i) * 4 + e) * 32 + l];
      int r = r0 + (l >> 2) + (e >= 2 ? 8 : 0);
      int col = col0 + i * 8 + (l & 3) * 2 + (e & 1);
      if (r < total && col < B) {
        if (splits > 1) {
          part[((u64)blockIdx.y * B + col) * total + r] = v;
        } else {
          if (bias) v += bias[r];
          float* o = out + (u64)(orow ? orow[col] : col) * ldo + r;
          *o = (mode & 1) ? *o + v : v;
        }
      }
    }
    __syncthreads();
  }
  if (splits == 1) return;
  // Threadfence reduction, as in attn_decode_t.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == (u32)splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  int n = min(MT, total - r0);
  for (int k = threadIdx.x; k < n * B; k += blockDim.x) {
    int col = k / n, r = r0 + k % n;
    float v = 0.f;
    for (int y = 0; y < splits; y++) v += __ldcg(&part[((u64)y * B + col) * total + r]);
    if (bias) v += bias[r];
    float* o = out + (u64)(orow ? orow[col] : col) * ldo + r;
    *o = (mode & 1) ? *o + v : v;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}
#define MATMUL_H16(NT)                                                                                        \
  extern "C" __global__ void __launch_bounds__(256, H16_MINB) matmul_h16_##NT(Seg s0, Seg s1, Seg s2, int cols,         \
                                                                   const u16* x, int B, float* out, int ldo,  \
                                                                   const int* orow, const float* bias,        \
                                                                   int mode, float* part, u32* counters) {    \
    matmul_h16_t<NT>(s0, s1, s2, cols, x, B, out, ldo, orow, bias, mode, part, counters);                     \
  }
MATMUL_H16(1)
MATMUL_H16(2)
MATMUL_H16(4)
MATMUL_H16(8)

// After the stacked Q/K/V matmul (bias added there), per row b: RoPE at pos[b] on Q and K, K and V
// into the pages of slot slot[b] (with kc = 0, a quantized cache: K rotated in place in qkv, which
// the attention kernel stores), Q (rounded to f16) into q [B][n_head * hd].
// bias (or null): added first (the cuBLAS step's matmul leaves it out). Grid B; block 256.
extern "C" __global__ void rope_store_b(float* qkv, const float* bias, const float* cosv, const float* sinv, const int* pos,
                                        const int* slot, const int* pages, int max_pages, u64 page_bytes,
                                        int n_head, int n_kv_head, int hd, int neox, float* q, u8* kc8, u8* vc8) {
  pdl_wait();
  int b = blockIdx.x, ps = pos[b];
  if (ps < 0) return;  // padding
  int half = hd / 2, kvd = n_kv_head * hd, qd = n_head * hd, row = qd + 2 * kvd;
  float* x = qkv + (u64)b * row;
  const int* pt = pages + slot[b] * max_pages;
  u16* kc = (u16*)kv_at(kc8, pt, page_bytes, ps, 2 * kvd);
  u16* vc = (u16*)kv_at(vc8, pt, page_bytes, ps, 2 * kvd);
  for (int p = threadIdx.x; p < (n_head + 2 * n_kv_head) * half; p += blockDim.x) {
    int h = p / half, k = p % half;
    int ra = h * hd + (neox ? k : 2 * k), rb = h * hd + (neox ? k + half : 2 * k + 1);
    float x0 = x[ra], x1 = x[rb];
    if (bias) {
      x0 += bias[ra];
      x1 += bias[rb];
    }
    if (h < n_head + n_kv_head) {
      float c = cosv[(u64)ps * half + k], sn = sinv[(u64)ps * half + k];
      float2 y = rope_rot(x0, x1, c, sn);
      float y0 = y.x, y1 = y.y;
      if (h < n_head) {
        q[(u64)b * qd + ra] = h2f(f2h(y0));
        q[(u64)b * qd + rb] = h2f(f2h(y1));
      } else if (!kc8) {
        x[ra] = y0;
        x[rb] = y1;
      } else {
        kc[ra - qd] = f2h(y0);
        kc[rb - qd] = f2h(y1);
      }
    } else if (vc8) {
      vc[ra - qd - kvd] = f2h(x0);
      vc[rb - qd - kvd] = f2h(x1);
    } else if (bias) {
      x[ra] = x0;
      x[rb] = x1;
    }
  }
}

// Rows from, from + 1, ... (blockIdx.x) of every layer (blockIdx.y) of one sequence between the
// paged pool (pk, pv: layer 0 of page 0; pt: the sequence's page table) and a contiguous cache
// (ck, cv: [layer][ctx] rows, as a session's; the sequence's row 0 at row `at`): into the pool
// when to_pool, else out of it. rb (a row's bytes) is a multiple of 16. Block 128.
extern "C" __global__ void kv_pages_copy(u8* pk, u8* pv, u8* ck, u8* cv, const int* pt, u64 page_bytes, int rb,
                                         int ctx, int at, int from, int to_pool) {
  int p = from + blockIdx.x, l = blockIdx.y;
  u64 po = (u64)pt[p / SPLIT] * page_bytes + ((u64)l * SPLIT + p % SPLIT) * rb;
  u64 co = ((u64)l * ctx + at + p) * rb;
  uint4 *a = (uint4*)(pk + po), *b = (uint4*)(ck + co), *c = (uint4*)(pv + po), *d = (uint4*)(cv + co);
  for (int i = threadIdx.x; i < rb / 16; i += blockDim.x) {
    if (to_pool) {
      a[i] = b[i];
      c[i] = d[i];
    } else {
      b[i] = a[i];
      d[i] = c[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mixture-of-experts FFN (Qwen3-MoE) over T rows at once (a decode step's one, a batch's rows, a
// prompt pass's tokens), as the CPU's cpu::moe_ffn and llama.cpp's build_moe_ffn compute it: the
// router's softmax, the K most probable experts with their probabilities renormalised, each
// route's SwiGLU FFN by its expert's rows of the stacked matrices, the routes' outputs summed in
// the router's order. Every route runs on its own (a row's bits do not depend on the other rows),
// so a decode step, a batch's rows and speculation's verify rows agree. The CPU reference is the
// CPU backend's MoE layer (tests/cuda.rs runs tiny qwen3moe on both).

__device__ __forceinline__ float block_max(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : NEG_INF * 10.f;
  return warp_max(t);
}

// Row blockIdx.x of x: rmsnorm(x) * w in f32 (xn, the router's input) and as q8 (aq, ad: the
// experts'). A block a row.
extern "C" __global__ void moe_norm(const float* x, const float* w, float eps, int dim, float* xn, i8* aq,
                                    float2* ad) {
  __shared__ float red[32];
  pdl_wait();
  u64 r = blockIdx.x;
  const float* xr = x + r * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  float scale = rsqrtf(ss / dim + eps);
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int b = threadIdx.x >> 5; b < dim / 32; b += nw) {
    int i = b * 32 + lane;
    float v = xr[i] * scale * w[i];
    xn[r * dim + i] = v;
    quant_lane(v, aq + r * dim + b * 32, ad + r * (dim / 32) + b);
  }
}

// logits[t][e] = router row e . row t: f32 weights against the f32 input (as the CPU and
// llama.cpp), other types against its q8. A warp an expert, 4 a block; grid (ceil(E / 4), T).
extern "C" __global__ void moe_router(Seg s, int dim, const float* xn, const i8* aq, const float2* ad,
                                      float* logits) {
  pdl_wait();
  int e = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  u64 t = blockIdx.y;
  if (e >= s.rows) return;
  const u8* row = s.w + (u64)e * s.row_bytes;
  float v;
  if (s.type == T_F32) {
    const float4* wr = (const float4*)row;
    const float4* xr = (const float4*)(xn + t * dim);
    float acc = 0.f;
    for (int i = lane; i < dim / 4; i += 32) {
      float4 a = wr[i], b = xr[i];
      acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
    v = warp_sum(acc);
  } else {
    v = row_dot<true>(s.type, row, dim / 32, aq + t * dim, ad + t * (dim / 32));
  }
  if (lane == 0) logits[t * s.rows + e] = v;
}

// Row blockIdx.x's routes: the softmax of its E logits, the K most probable experts (ties: the
// lower index), highest first, their probabilities divided by their sum (at least 2^-14, as
// llama.cpp clamps it). A block a row; E <= 1024, K <= 64. A row whose logits are not numbers
// (a batch's padding) still gets K distinct experts in range.
extern "C" __global__ void moe_topk(const float* logits, int E, int K, int* ids, float* wts) {
  __shared__ float p[1024];
  __shared__ float red[32];
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ int chosen[64];
  __shared__ float cp[64];
  pdl_wait();
  u64 t = blockIdx.x;
  const float* l = logits + t * E;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float m = NEG_INF * 10.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
  m = block_max(m, red);
  float s = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float v = expf(l[e] - m);
    p[e] = v;
    s += v;
  }
  s = block_sum(s, red);
  float inv = 1.f / s;
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] *= inv;
  __syncthreads();
  for (int k = 0; k < K; k++) {
    float v = NEG_INF * 10.f;
    int idx = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (am_first(p[e], e, v, idx)) {
        v = p[e];
        idx = e;
      }
    am_warp(v, idx);
    if (lane == 0) {
      bv[w] = v;
      bi[w] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int j = 1; j < nw; j++)
        if (am_first(bv[j], bi[j], v, idx)) {
          v = bv[j];
          idx = bi[j];
        }
      if (idx >= E) {  // nothing comparable left: the lowest expert not chosen
        for (idx = 0; idx < E; idx++) {
          bool used = false;
          for (int j = 0; j < k; j++) used |= chosen[j] == idx;
          if (!used) break;
        }
        v = 0.f;
      }
      chosen[k] = idx;
      cp[k] = v;
      p[idx] = -1.f;  // taken: below every probability
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int k = 0; k < K; k++) total += cp[k];
    total = fmaxf(total, 6.103515625e-5f);
    for (int k = 0; k < K; k++) {
      ids[t * K + k] = chosen[k];
      wts[t * K + k] = cp[k] / total;
    }
  }
}

// The n routes grouped by expert (order[i]: a route index t * K + k), so that one expert's
// blocks run together and its weights come from L2 after the first; and the groups cut into
// tiles of up to TILE routes of one expert (tiles: (first index into order, routes) pairs; their
// number in *ntiles), which the tile kernels below read each weight chunk once for. One block of
// 1024 threads; the order within an expert's group is the atomics' (no result depends on it).
#define TILE 8
extern "C" __global__ void moe_sort(const int* ids, int n, int E, int* order, int* tiles, int* ntiles) {
  __shared__ int cnt[1024];
  __shared__ int num[1024];
  pdl_wait();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int at = 0, nt = 0;
    for (int e = 0; e < E; e++) {
      int c = cnt[e];
      num[e] = c;
      cnt[e] = at;
      for (int o = 0; o < c; o += TILE) {
        tiles[2 * nt] = at + o;
        tiles[2 * nt + 1] = min(TILE, c - o);
        nt++;
      }
      at += c;
    }
    *ntiles = nt;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) order[atomicAdd(&cnt[ids[i]], 1)] = i;
}

// acc[j] = the dot of weight row `row` (type T) with q8 activation row rows[j] (j < n), each
// summed as row_dot sums it (lane l the chunks l, l + 32, ..., finish()'s bits, then warp_sum):
// a row's bits whatever the tile. Each weight chunk is unpacked once for the n rows. False for a
// type without an unpacked form (the caller then runs row_dot per row).
template <int T>
__device__ __forceinline__ bool tile_row_dots(const u8* row, int cols, const i8* aq, const float2* ad,
                                              const int* rows, int n, float (&acc)[TILE]) {
  if (!int_form(T)) return false;
  int lane = threadIdx.x & 31, nch = cols / 32;
#pragma unroll
  for (int j = 0; j < TILE; j++) acc[j] = 0.f;
  for (int c = lane; c < nch; c += 32) {
    W32 w;
    unpack32<T>(row, c, w, nch);
#pragma unroll
    for (int j = 0; j < TILE; j++)
      if (j < n) {
        u64 b = rows[j];
        const int4* ap = (const int4*)(aq + b * cols + c * 32);
        int4 a0 = ap[0], a1 = ap[1];
        float2 ds = ad[b * nch + c];
        acc[j] += finish<T>(w, dot16(w.q, a0), dot16(w.q + 4, a1), ds.x, ds.y);
      }
  }
#pragma unroll
  for (int j = 0; j < TILE; j++) acc[j] = warp_sum(acc[j]);
  return true;
}
__device__ void tile_dots_any(int type, const u8* row, int cols, const i8* aq, const float2* ad, const int* rows,
                              int n, float (&acc)[TILE]) {
  bool ok;
  switch (type) {
    case T_Q4_K: ok = tile_row_dots<T_Q4_K>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q6_K: ok = tile_row_dots<T_Q6_K>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q4_KR: ok = tile_row_dots<T_Q4_KR>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q6_KR: ok = tile_row_dots<T_Q6_KR>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q5_0: ok = tile_row_dots<T_Q5_0>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q5_0R: ok = tile_row_dots<T_Q5_0R>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q8_0: ok = tile_row_dots<T_Q8_0>(row, cols, aq, ad, rows, n, acc); break;
    case T_Q5_K: ok = tile_row_dots<T_Q5_K>(row, cols, aq, ad, rows, n, acc); break;
    default: ok = false;
  }
  if (ok) return;
  int nch = cols / 32;
  for (int j = 0; j < n; j++) acc[j] = row_dot<true>(type, row, nch, aq + (u64)rows[j] * cols, ad + (u64)rows[j] * nch);
}

// moe_glu over a tile of routes of one expert (blockIdx.y: the tile; past *ntiles nothing): each
// weight row read once for the tile's routes, each route's h with moe_glu's bits.
extern "C" __global__ void moe_glu_tiles(Seg g, Seg u, int dim, int f, const i8* aq, const float2* ad, const int* ids,
                                         const int* order, const int* tiles, const int* ntiles, int K, i8* hq,
                                         float2* hd) {
  __shared__ float h[TILE][32];
  __shared__ int routes[TILE], toks[TILE];
  pdl_wait();
  int y = blockIdx.y;
  if (y >= *ntiles) return;
  int start = tiles[2 * y], n = tiles[2 * y + 1];
  if (threadIdx.x < TILE) {
    int r = order[start + min((int)threadIdx.x, n - 1)];
    routes[threadIdx.x] = r;
    toks[threadIdx.x] = r / K;
  }
  __syncthreads();
  int e = ids[routes[0]], w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = w; i < 32; i += blockDim.x >> 5) {
    u64 j = (u64)e * f + blockIdx.x * 32 + i;
    float x[TILE], z[TILE];
    tile_dots_any(g.type, g.w + j * g.row_bytes, dim, aq, ad, toks, n, x);
    tile_dots_any(u.type, u.w + j * u.row_bytes, dim, aq, ad, toks, n, z);
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < TILE; k++)
        if (k < n) h[k][i] = x[k] / (1.f + expf(-x[k])) * z[k];
  }
  __syncthreads();
  if (w < n) quant_lane(h[w][lane], hq + (u64)routes[w] * f + blockIdx.x * 32, hd + (u64)routes[w] * (f / 32) + blockIdx.x);
}

// moe_down over a tile of routes of one expert: each weight row read once for the tile's routes.
extern "C" __global__ void moe_down_tiles(Seg s, int f, int dim, const i8* hq, const float2* hd, const int* ids,
                                          const int* order, const int* tiles, const int* ntiles, float* y) {
  __shared__ int routes[TILE];
  pdl_wait();
  int t = blockIdx.y;
  if (t >= *ntiles) return;
  int start = tiles[2 * t], n = tiles[2 * t + 1];
  if (threadIdx.x < TILE) routes[threadIdx.x] = order[start + min((int)threadIdx.x, n - 1)];
  __syncthreads();
  int i = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (i >= dim) return;
  float acc[TILE];
  tile_dots_any(s.type, s.w + ((u64)ids[routes[0]] * dim + i) * s.row_bytes, f, hq, hd, routes, n, acc);
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int k = 0; k < TILE; k++)
      if (k < n) y[(u64)routes[k] * dim + i] = acc[k];
}

// h[r] = silu(gate_e . a[t]) * (up_e . a[t]) for route r = blockIdx.y, token t = r / K, expert
// e = ids[r]; quantized to q8 (hq [routes][f], hd [routes][f / 32]). A block makes one q8 block:
// 32 rows of the expert, a warp a row at a time. (A decode step's; several rows take the tiles.)
extern "C" __global__ void moe_glu(Seg g, Seg u, int dim, int f, const i8* aq, const float2* ad, const int* ids,
                                   int K, i8* hq, float2* hd) {
  __shared__ float h[32];
  pdl_wait();
  int r = blockIdx.y;
  int e = ids[r], w = threadIdx.x >> 5, lane = threadIdx.x & 31, nch = dim / 32;
  u64 t = r / K;
  const i8* a = aq + t * dim;
  const float2* ds = ad + t * nch;
  for (int i = w; i < 32; i += blockDim.x >> 5) {
    u64 j = (u64)e * f + blockIdx.x * 32 + i;
    float x = row_dot<true>(g.type, g.w + j * g.row_bytes, nch, a, ds);
    float y = row_dot<true>(u.type, u.w + j * u.row_bytes, nch, a, ds);
    if (lane == 0) h[i] = x / (1.f + expf(-x)) * y;
  }
  __syncthreads();
  if (w == 0) quant_lane(h[lane], hq + (u64)r * f + blockIdx.x * 32, hd + (u64)r * (f / 32) + blockIdx.x);
}

// y[r] = down_e . h[r] for route r (as in moe_glu): a warp a row of the expert, 4 a block; grid
// (ceil(dim / 4), routes).
extern "C" __global__ void moe_down(Seg s, int f, int dim, const i8* hq, const float2* hd, const int* ids,
                                    float* y) {
  pdl_wait();
  int r = blockIdx.y;
  int i = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (i >= dim) return;
  int e = ids[r], nch = f / 32;
  float v = row_dot<true>(s.type, s.w + ((u64)e * dim + i) * s.row_bytes, nch, hq + (u64)r * f,
                          hd + (u64)r * nch);
  if ((threadIdx.x & 31) == 0) y[(u64)r * dim + i] = v;
}

// out[t] = Σ_k wts[t][k] · y[t K + k] in the router's order (k = 0 first), stored or added to out.
extern "C" __global__ void moe_combine(const float* y, const float* wts, int K, int dim, float* out, int add) {
  pdl_wait();
  u64 t = blockIdx.y;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  const float* wt = wts + t * K;
  const float* yr = y + t * K * dim + i;
  float acc = __fmul_rn(yr[0], wt[0]);
  for (int k = 1; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(yr[(u64)k * dim], wt[k]));
  u64 o = t * dim + i;
  out[o] = add ? out[o] + acc : acc;
}

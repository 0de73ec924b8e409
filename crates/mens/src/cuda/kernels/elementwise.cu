// x (row blockIdx.x) -> rmsnorm(x) * w, quantized to q8. Every block of a row sums the squares of
// the whole row (1024 threads: the same bits in every block) and quantizes the 32-value chunks
// blockIdx.y, blockIdx.y + gridDim.y, ... a warp each (gridDim.y = dim / 1024 blocks: one chunk a
// warp, a short latency chain for a decode step's vector).
// The weight of the thread's first chunk is loaded before pdl_wait() (never written).
extern "C" __global__ void rmsnorm_q8(const float* x, const float* w, float eps, int dim, i8* aq, float2* ad) {
  __shared__ float red[32];
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int b0 = blockIdx.y * nw + (threadIdx.x >> 5);
  float w0 = b0 < dim / 32 ? w[b0 * 32 + lane] : 0.f;
  pdl_wait();
  const float* xr = x + (u64)blockIdx.x * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  pdl_trigger();
  float scale = rsqrtf(ss / dim + eps);
  for (int b = b0; b < dim / 32; b += gridDim.y * nw) {
    int i = b * 32 + lane;
    quant_lane(xr[i] * scale * (b == b0 ? w0 : w[i]), aq + (u64)blockIdx.x * dim + b * 32,
               ad + (u64)blockIdx.x * (dim / 32) + b);
  }
}

// Deferred norm (see parts_lane in common.cuh): row blockIdx.x's groups, a warp each, as q8 of
// x · w (aq, ad) and their sums of squares of x (np: NP_REPS copies a row); the residual matvecs' cluster
// tails (matvec_add_nq_t) make the same bits.
extern "C" __global__ void rmsnorm_q8d(const float* x, const float* w, int dim, i8* aq, float2* ad, float* np) {
  int lane = threadIdx.x & 31, groups = dim / 32;
  int g = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  float wl = g < groups ? w[g * 32 + lane] : 0.f;
  pdl_wait();
  if (g >= groups) return;
  float v = x[(u64)blockIdx.x * dim + g * 32 + lane];
  pdl_trigger();
  u64 o = (u64)blockIdx.x * groups;
  norm_group(v, wl, g, aq + o * 32, ad + o, np + (u64)blockIdx.x * NP_REPS * NP_MAX);
}

// The batched step's deferred norm: rmsnorm_q8d's q8 of x · w for row blockIdx.x, and the row's
// scale in ns[row], as the decode matvecs make it from the sums (norm_scale over parts_lane).
extern "C" __global__ void rmsnorm_q8s(const float* x, const float* w, float eps, int dim, i8* aq, float2* ad,
                                       float* ns) {
  __shared__ float parts[NP_MAX];
  pdl_wait();
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5, groups = dim / 32;
  u64 row = blockIdx.x;
  for (int g = threadIdx.x >> 5; g < groups; g += nw) {
    float v = x[row * dim + g * 32 + lane];
    float p = group_q8(v, w[g * 32 + lane], aq + row * dim + g * 32, ad + row * groups + g);
    if (lane == 0) parts[g] = p;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float sc = norm_scale(parts_lane(parts, groups), groups, eps);
    if (lane == 0) ns[row] = sc;
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


// h16[t][i] = silu(gu[t][i]) * gu[t][f + i] (prefill).
extern "C" __global__ void swiglu_f16(const float* gu, int f, int ntok, u16* h) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)ntok * f) return;
  u64 t = i / f, k = i % f;
  float g = gu[t * 2 * f + k], u = gu[t * 2 * f + f + k];
  h[i] = f2h(g / (1.f + expf(-g)) * u);
}

// As swiglu_f16 from gate and up in f16 (prefill's GEMM writes them so: half the bytes), eight
// values a thread with 16-byte loads and stores; f a multiple of 8.
extern "C" __global__ void swiglu_h16(const u16* gu, int f, int ntok, u16* h) {
  u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= (u64)ntok * f) return;
  u64 t = i / f, k = i % f;
  uint4 gv = *(const uint4*)(gu + t * 2 * f + k), uv = *(const uint4*)(gu + t * 2 * f + f + k);
  const u16 *g = (const u16*)&gv, *u = (const u16*)&uv;
  uint4 out;
  u16* o = (u16*)&out;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    float x = h2f(g[j]);
    o[j] = f2h(x / (1.f + expf(-x)) * h2f(u[j]));
  }
  *(uint4*)(h + i) = out;
}


// Per-head RMSNorm of the Q and K heads of T rows of a stacked Q/K/V buffer (row stride `row`
// floats; the K heads follow the Q heads), in place, before RoPE (Qwen3). Grid (T, n_head +
// n_kv_head); block 128.
extern "C" __global__ void qk_norm(float* qkv, int row, int n_head, int hd, const float* wq, const float* wk,
                                   float eps) {
  __shared__ float red[32];
  pdl_wait();
  float* v = qkv + (u64)blockIdx.x * row + (u64)blockIdx.y * hd;
  const float* w = (int)blockIdx.y < n_head ? wq : wk;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
  ss = block_sum(ss, red);
  float scale = rsqrtf(ss / hd + eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * scale * w[i];
}

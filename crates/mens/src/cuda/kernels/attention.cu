// Decode attention, split over the sequence (flash decoding): block (kv head, split) scores the
// split's keys against the g query heads of that KV head (GQA without copies) and writes an
// unnormalised partial output with its max and sum; the last split block of a KV head to finish
// combines the splits and quantizes the g heads' outputs to q8 for the O matvec. Block: 256
// threads. HD (head dim) is a template parameter so that the K row loads unroll.
// A block (kv head `kvh`, worker `worker` of `workers`) takes splits worker, worker + workers, ...
// of a sequence of `len` keys.
template <int HD>
__device__ void attn_decode_t(const float* qkv, const u16* kc, const u16* vc, int len,
                              int n_head, int n_kv_head, float scale, float* part_o, float2* part_ml,
                              u32* counters, i8* aq, float2* ad, int kvh, int worker, int workers,
                              u16* o16 = 0) {
  constexpr int QUADS = HD / 4, GROUPS = 256 / QUADS;
  __shared__ float qs[MAXG * HD];
  __shared__ float sc[MAXG * SPLIT];
  __shared__ float red[GROUPS * MAXG * HD];
  __shared__ bool last;
  int tid = threadIdx.x;
  int g = n_head / n_kv_head, kvd = n_kv_head * HD;
  int ns = (len + SPLIT - 1) / SPLIT;
  if (worker >= ns) return;  // workers past the sequence take no part
  for (int i = tid; i < g * HD; i += blockDim.x) qs[i] = qkv[kvh * g * HD + i] * scale;
  __syncthreads();
  int lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
  int mine = 0;
  for (int split = worker; split < ns; split += workers) {
  mine++;
  int k0 = split * SPLIT;
  int n = min(SPLIT, len - k0);
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
  __syncthreads();  // sc and red are reused by the next split
  }
  // The last block of this KV head combines the splits (threadfence reduction): every thread
  // makes its partial results visible device-wide before the block takes its ticket, and the
  // last block reads the others' results from L2 (__ldcg), never from a stale L1 line.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&counters[kvh], mine) + mine == (u32)ns;
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
    if (o16)
      o16[i] = f2h(num / den);  // f16 for the batch's tensor-core matmul
    else
      quant_lane(num / den, aq + (i & ~31), ad + i / 32);
  }
  if (tid == 0) counters[kvh] = 0;
}
extern "C" __global__ void attn_decode64(const float* qkv, const u16* kc, const u16* vc, const int* pos, int n_head,
                                         int n_kv_head, float scale, float* part_o, float2* part_ml,
                                         u32* counters, i8* aq, float2* ad) {
  attn_decode_t<64>(qkv, kc, vc, *pos + 1, n_head, n_kv_head, scale, part_o, part_ml, counters, aq, ad,
                    blockIdx.x, blockIdx.y, gridDim.y);
}
extern "C" __global__ void attn_decode128(const float* qkv, const u16* kc, const u16* vc, const int* pos, int n_head,
                                          int n_kv_head, float scale, float* part_o, float2* part_ml,
                                          u32* counters, i8* aq, float2* ad) {
  attn_decode_t<128>(qkv, kc, vc, *pos + 1, n_head, n_kv_head, scale, part_o, part_ml, counters, aq, ad,
                     blockIdx.x, blockIdx.y, gridDim.y);
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


// Decode attention, split over the sequence (flash decoding): block (kv head, split) scores the
// split's keys against the g query heads of that KV head (GQA without copies) and writes an
// unnormalised partial output with its max and sum; the last split block of a KV head to finish
// combines the splits and quantizes the g heads' outputs to q8 for the O matvec (a sequence of
// one split finishes in its block: no partial results, no counter). Block: 256
// threads. HD (head dim) is a template parameter so that the K row loads unroll.
// A block (kv head `kvh`, worker `worker` of `workers`) takes splits worker, worker + workers, ...
// of a sequence of `len` keys, for head group `hg` of `hgs`: the KV head's g query heads in hgs
// groups of ceil(g / hgs), a block each (the heads do not meet, so the bits do not depend on hgs;
// more blocks shorten each block's chain of scoring, softmax and P.V). A quantized cache takes
// hgs = 1: its new row is stored by one block and read by the others of its KV head.
// T: the cache type (T_F16, T_Q8_0 or T_Q4_0; kv_row_bytes), dequantized in registers. A
// quantized cache gets its new row here: the writers left the step's K and V as f32 at kv_new
// (V kv_dim after K), and the block that owns the last split stores the KV head's part of row
// len - 1 before reading it (no other block reads that row).
// pt: the sequence's page table (a batch's paged pool: split s lives in page pt[s], page_bytes
// apart, SPLIT rows a page), or null for a contiguous cache.
// Value i of the attention's output (a warp holds 32 consecutive values): rotated back from the
// V blocks' rotation (quantized caches), then to f16 (o16: the batch's tensor-core matmul) or q8.
// An f16 cache's loads for split `split` (n keys) of KV head kvh: the scoring thread's quarter
// of K row tid / 4 (ku) and, with `v`, the P.V thread's 4 dimensions of keys tid / (HD / 4) +
// i * GROUPS (vu).
template <int HD>
__device__ __forceinline__ void kv_f16_loads(const u8* kc, const u8* vc, const int* pt, u64 page_bytes, int split,
                                             int n, int rb, int kvh, int tid, uint4* ku, uint2* vu, bool v) {
  constexpr int QUADS = HD / 4, GROUPS = 256 / QUADS, PD = HD / 4, VK = SPLIT / GROUPS;
  int k0 = split * SPLIT, kq = tid >> 2, part = tid & 3;
  if (kq < n) {
    const uint4* p = (const uint4*)(kv_at(kc, pt, page_bytes, k0, rb) + (u64)kq * rb + 2 * (kvh * HD + part * PD));
#pragma unroll
    for (int i = 0; i < PD / 8; i++) ku[i] = p[i];
  }
  if (!v) return;
  int dq = tid % QUADS, kg = tid / QUADS;
  const u8* vbase = kv_at(vc, pt, page_bytes, k0, rb);
#pragma unroll
  for (int i = 0; i < VK; i++)
    if (kg + i * GROUPS < n) vu[i] = *(const uint2*)(vbase + (u64)(kg + i * GROUPS) * rb + 2 * (kvh * HD + 4 * dq));
}
template <int T>
__device__ __forceinline__ void attn_out(float o, int i, int lane, u16* o16, i8* aq, float2* ad) {
  if (T != T_F16) o = hadamard32(o, lane);
  if (o16)
    o16[i] = f2h(o);
  else
    quant_lane(o, aq + (i & ~31), ad + i / 32);
}
template <int HD, int T>
__device__ void attn_decode_t(const float* qkv, const u8* kc, u8* vc, int len,
                              int n_head, int n_kv_head, float scale, float* part_o, float2* part_ml,
                              u32* counters, i8* aq, float2* ad, int kvh, int worker, int workers,
                              u16* o16, const float* kv_new, const int* pt, u64 page_bytes, int hg, int hgs) {
  constexpr int QUADS = HD / 4, GROUPS = 256 / QUADS;
  // Q in shared memory, a quarter of a head (PD values) per scoring thread, each quarter one
  // float past the last so that the four quarters fall in different banks.
  constexpr int PD = HD / 4, QS = 4 * (PD + 1);
  __shared__ float qs[MAXG * QS];
  __shared__ float sc[MAXG * SPLIT];
  __shared__ float red[GROUPS * MAXG * HD];
  __shared__ float den1[MAXG];
  __shared__ bool last;
  int tid = threadIdx.x;
  int g = n_head / n_kv_head, kvd = n_kv_head * HD, rb = kv_row_bytes(T, kvd);
  int ns = (len + SPLIT - 1) / SPLIT;
  if (worker >= ns) return;  // workers past the sequence take no part
  // This block's heads: hb .. hb + gn - 1 of the n_head (gn of its KV head's g).
  int gh = (g + hgs - 1) / hgs, h0 = hg * gh, gn = min(gh, g - h0), hb = kvh * g + h0;
  if (gn <= 0) return;
  u32* counter = counters + kvh * hgs + hg;
  // An f16 cache's loads of the block's first split (its K quarter-rows and V quads) are issued
  // before Q is read, so that their latency and Q's overlap (none depends on the other; the new
  // row came from the kernel before). -DATTN_K_LATE: after Q, for measurements.
  constexpr int VK = SPLIT / GROUPS;
#if defined(ATTN_K_LATE) || defined(ATTN_V_LATE)
  constexpr bool hoist = false;
#else
  constexpr bool hoist = T == T_F16;
#endif
  uint4 ku[PD / 8];
  uint2 vpre[VK];
  if (hoist) kv_f16_loads<HD>(kc, vc, pt, page_bytes, worker, min(SPLIT, len - worker * SPLIT), rb, kvh, tid, ku, vpre, true);
  for (int i = tid; i < gn * HD; i += blockDim.x) {
    int h = i / HD, d = i % HD;
    qs[h * QS + (d / PD) * (PD + 1) + d % PD] = qkv[hb * HD + i] * scale;
  }
  int lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
  if (T != T_F16) {
    // Q rotated as the cache's blocks are (hadamard32), a warp a block.
    __syncthreads();
    for (int b = w; b < gn * HD / 32; b += nw) {
      int h = b / (HD / 32), d = (b % (HD / 32)) * 32 + lane;
      float* x = qs + h * QS + (d / PD) * (PD + 1) + d % PD;
      *x = hadamard32(*x, lane);
    }
  }
  if (T != T_F16 && (ns - 1) % workers == worker) {
    // K blocks then V blocks of this head, a warp each.
    for (int b = w; b < HD / 16; b += nw) {
      int v = b >= HD / 32, j = kvh * (HD / 32) + b % (HD / 32);
      u8* row = (u8*)kv_at(v ? vc : kc, pt, page_bytes, len - 1, rb);
      kv_store_block<T>(kv_new[v * kvd + j * 32 + lane], row, kvd, j, lane);
    }
  }
  __syncthreads();
  int mine = 0;
  for (int split = worker; split < ns; split += workers) {
  mine++;
  int k0 = split * SPLIT;
  int n = min(SPLIT, len - k0);
  // P.V's thread: 4 dimensions (dq) of keys kg, kg + GROUPS, ... An f16 cache's V values are
  // loaded here, with K, so that their latency is not paid again after the softmax (the NVRTC
  // define ATTN_V_LATE loads them after it, for measurements).
  int dq = tid % QUADS, kg = tid / QUADS;
#ifdef ATTN_V_LATE
  constexpr bool early = false;
#else
  constexpr bool early = T == T_F16;
#endif
  const u8* vbase = kv_at(vc, pt, page_bytes, k0, rb);
  if (T == T_F16 && !(hoist && split == worker))
    kv_f16_loads<HD>(kc, vc, pt, page_bytes, split, n, rb, kvh, tid, ku, vpre, early);
  // Scores: four threads per key, each a quarter of the head's dimensions (one 16-byte load
  // per 8 f16 values, whole q8_0/q4_0 blocks), summed with two shuffles.
  {
    int kq = tid >> 2, part = tid & 3;
    float kv[PD];
    if (kq < n) {
      const u8* krow = kv_at(kc, pt, page_bytes, k0, rb) + (u64)kq * rb;
      int d0 = kvh * HD + part * PD;
      if (T == T_F16) {
        const uint4* u = ku;  // kv_f16_loads
#pragma unroll
        for (int i = 0; i < PD / 8; i++) {
          kv[8 * i] = h2f(u[i].x & 0xffff); kv[8 * i + 1] = h2f(u[i].x >> 16);
          kv[8 * i + 2] = h2f(u[i].y & 0xffff); kv[8 * i + 3] = h2f(u[i].y >> 16);
          kv[8 * i + 4] = h2f(u[i].z & 0xffff); kv[8 * i + 5] = h2f(u[i].z >> 16);
          kv[8 * i + 6] = h2f(u[i].w & 0xffff); kv[8 * i + 7] = h2f(u[i].w >> 16);
        }
      } else if (T == T_Q8_0) {
        const uint4* p = (const uint4*)(krow + d0);
        uint4 u[PD / 16];
#pragma unroll
        for (int i = 0; i < PD / 16; i++) u[i] = p[i];
        float d = kv_scale(T, krow, kvd, d0);
#pragma unroll
        for (int i = 0; i < PD / 16; i++) {
          u32 w4[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
#pragma unroll
          for (int k = 0; k < 16; k++) kv[16 * i + k] = d * sbyte(w4[k >> 2], k & 3);
        }
      } else {
        // The 16 bytes of the block hold values i (low nibble) and i + 16 (high nibble).
        uint4 u = *(const uint4*)(krow + (d0 >> 5) * 16);
        float d = kv_scale(T, krow, kvd, d0);
        u32 w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < PD; e++) {
          int i = (d0 & 31) + e;  // value index in the block (PD = 16: one half, PD = 32: all)
          int sh = i >= 16 ? 4 : 0, byte = i & 15;
          kv[e] = d * (float)((int)((w4[byte >> 2] >> (8 * (byte & 3) + sh)) & 15) - 8);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < PD; e++) kv[e] = 0.f;
    }
    float acc[MAXG];
#pragma unroll
    for (int h = 0; h < MAXG; h++) {
      acc[h] = 0.f;
      if (h < gn) {
        const float* q = qs + h * QS + part * (PD + 1);
#pragma unroll
        for (int e = 0; e < PD; e++) acc[h] += q[e] * kv[e];
      }
      acc[h] += __shfl_xor_sync(0xffffffff, acc[h], 1);
      acc[h] += __shfl_xor_sync(0xffffffff, acc[h], 2);
    }
    if (kq < n && part == 0) {
#pragma unroll
      for (int h = 0; h < MAXG; h++)
        if (h < gn) sc[h * SPLIT + kq] = acc[h];
    }
  }
  __syncthreads();
  // Softmax pieces per head: warp w takes heads w, w+8, ...
  for (int h = w; h < gn; h += nw) {
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
    if (lane == 0) {
      part_ml[split * n_head + hb + h] = make_float2(m, l);
      den1[h] = l;
    }
  }
  __syncthreads();
  // P.V: thread = (4 dimensions, key group); the groups are summed through shared memory.
  float a[4][MAXG];
#pragma unroll
  for (int h = 0; h < MAXG; h++) a[0][h] = a[1][h] = a[2][h] = a[3][h] = 0.f;
#pragma unroll
  for (int i = 0; i < VK; i++) {
    int k = kg + i * GROUPS;
    if (k >= n) break;
    float4 v;
    if (early)
      v = make_float4(h2f(vpre[i].x & 0xffff), h2f(vpre[i].x >> 16), h2f(vpre[i].y & 0xffff), h2f(vpre[i].y >> 16));
    else
      v = kv_get4<T>(vbase + (u64)k * rb, kvd, kvh * HD + 4 * dq);
    float v0 = v.x, v1 = v.y, v2 = v.z, v3 = v.w;
#pragma unroll
    for (int h = 0; h < MAXG; h++)
      if (h < gn) {
        float p = sc[h * SPLIT + k];
        a[0][h] += p * v0;
        a[1][h] += p * v1;
        a[2][h] += p * v2;
        a[3][h] += p * v3;
      }
  }
  pdl_trigger();
#pragma unroll
  for (int h = 0; h < MAXG; h++)
    if (h < gn)
#pragma unroll
      for (int e = 0; e < 4; e++) red[(kg * MAXG + h) * HD + 4 * dq + e] = a[e][h];
  __syncthreads();
  for (int i = tid; i < gn * HD; i += blockDim.x) {
    int h = i / HD, d = i % HD;
    float v = 0.f;
#pragma unroll
    for (int j = 0; j < GROUPS; j++) v += red[(j * MAXG + h) * HD + d];
    // One split (up to SPLIT keys): no other block to wait for, so its output is final here,
    // with the combine's bits (its max is the split's: expf(0) = 1, den = l, num = v).
    if (ns == 1)
      attn_out<T>(v / den1[h], hb * HD + i, lane, o16, aq, ad);
    else
      part_o[((u64)split * n_head + hb + h) * HD + d] = v;
  }
  if (ns == 1) return;
  __syncthreads();  // sc and red are reused by the next split
  }
  // The last block of this KV head combines the splits (threadfence reduction): every thread
  // makes its partial results visible device-wide before the block takes its ticket, and the
  // last block reads the others' results from L2 (__ldcg), never from a stale L1 line.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counter, mine) + mine == (u32)ns;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int b = w; b < gn * HD / 32; b += nw) {
    int h = hb + (b * 32) / HD, d = (b * 32) % HD + lane;
    // The max and the denominator with the lanes across splits; the numerator (a dimension per
    // lane) with eight splits' loads in flight: at long contexts this loop is latency-bound.
    float m = NEG_INF;
    for (int s = lane; s < ns; s += 32) m = fmaxf(m, __ldcg(&part_ml[s * n_head + h]).x);
    m = warp_max(m);
    float den = 0.f;
    for (int s = lane; s < ns; s += 32) {
      float2 ml = __ldcg(&part_ml[s * n_head + h]);
      den += ml.y * expf(ml.x - m);
    }
    den = warp_sum(den);
    float acc8[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc8[k] = 0.f;
    int s = 0;
    for (; s + 8 <= ns; s += 8) {
#pragma unroll
      for (int k = 0; k < 8; k++) {
        float2 ml = __ldcg(&part_ml[(s + k) * n_head + h]);
        acc8[k] += __ldcg(&part_o[((u64)(s + k) * n_head + h) * HD + d]) * expf(ml.x - m);
      }
    }
    for (; s < ns; s++) {
      float2 ml = __ldcg(&part_ml[s * n_head + h]);
      acc8[0] += __ldcg(&part_o[((u64)s * n_head + h) * HD + d]) * expf(ml.x - m);
    }
    float num = ((acc8[0] + acc8[1]) + (acc8[2] + acc8[3])) + ((acc8[4] + acc8[5]) + (acc8[6] + acc8[7]));
    attn_out<T>(num / den, h * HD + d, lane, o16, aq, ad);
  }
  if (tid == 0) *counter = 0;
}
#define ATTN_DECODE(NAME, HD, T)                                                                          \
  extern "C" __global__ void NAME(const float* qkv, u8* kc, u8* vc, const int* pos, int n_head,                \
                                  int n_kv_head, float scale, float* part_o, float2* part_ml, u32* counters,  \
                                  i8* aq, float2* ad) {                                                       \
    pdl_wait();                                                                                              \
    int hgs = gridDim.x / n_kv_head;                                                                         \
    attn_decode_t<HD, T>(qkv, kc, vc, *pos + 1, n_head, n_kv_head, scale, part_o, part_ml, counters, aq, ad,  \
                         blockIdx.x / hgs, blockIdx.y, gridDim.y, 0, qkv + n_head * HD, 0, 0,                 \
                         blockIdx.x % hgs, hgs);                                                             \
  }
#ifndef MENS_BATCH_MODULE
ATTN_DECODE(attn_decode64, 64, T_F16)
ATTN_DECODE(attn_decode128, 128, T_F16)
ATTN_DECODE(attn_decode64_q8, 64, T_Q8_0)
ATTN_DECODE(attn_decode128_q8, 128, T_Q8_0)
ATTN_DECODE(attn_decode64_q4, 64, T_Q4_0)
ATTN_DECODE(attn_decode128_q4, 128, T_Q4_0)
#endif

// Prefill attention, step 2 of 3 (between two cuBLAS batched GEMMs): causal softmax of the scores
// S [kv_head][t*g + j][L] (row stride ld) of `ntok` queries starting at query t0 of the batch into
// P (f16, same layout). Query t0 + t sees keys 0..pos0 + t0 + t.
#ifndef MENS_BATCH_MODULE
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
#endif

// Prefill attention, step 3: O [kv_head][t*g + j][hd] (f32) -> att [t][head*hd] (f16).
#ifndef MENS_BATCH_MODULE
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
#endif

// Prefill attention, flash-attention style: block (query tile of FA_Q tokens, query head) walks the
// cache in tiles of FA_K keys held in shared memory, with an online softmax; the score matrix never
// leaves registers. Four threads per query, each with HD/4 dimensions of q and of the accumulator
// (scores summed with two shuffles). Query t (at position pos0 + t) sees keys 0..pos0 + t; GQA reads
// the KV head's cache rows in place. Output: att [t][head * HD] in f16 for the O GEMM.
#define FA_Q 64
#define FA_K 32
template <int HD, int T>
__device__ void flash_prefill_t(const float* qkv, const u8* kc, const u8* vc, const int* pos, int ntok,
                                int n_head, int n_kv_head, float scale, u16* att) {
  constexpr int QD = HD / 4, Q4 = QD / 4, R4 = HD / 4;
  __shared__ float4 ks[FA_K * R4];
  __shared__ float4 vs[FA_K * R4];
  int h = blockIdx.y, g = n_head / n_kv_head, kvh = h / g;
  int qi = threadIdx.x >> 2, quarter = threadIdx.x & 3;
  int t = blockIdx.x * FA_Q + qi;
  int pos0 = *pos;
  int row = (n_head + 2 * n_kv_head) * HD, kvd = n_kv_head * HD, rb = kv_row_bytes(T, kvd);
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
        kv = kv_get4<T>(kc + (u64)key * rb, kvd, kvh * HD + 4 * d4);
        vv = kv_get4<T>(vc + (u64)key * rb, kvd, kvh * HD + 4 * d4);
      }
      ks[i] = kv;
      vs[i] = vv;
    }
    if (T != T_F16) {
      // The tile's rows back from the cache's rotation (hadamard32), a warp a block.
      __syncthreads();
      int lane = threadIdx.x & 31;
      for (int b = threadIdx.x >> 5; b < 2 * FA_K * HD / 32; b += blockDim.x >> 5) {
        float* x = (float*)(b < FA_K * HD / 32 ? ks : vs) + (b % (FA_K * HD / 32)) * 32 + lane;
        *x = hadamard32(*x, lane);
      }
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
#define FLASH_PREFILL(NAME, HD, T)                                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                     \
      NAME(const float* qkv, const u8* kc, const u8* vc, const int* pos, int ntok, int n_head, int n_kv_head, \
           float scale, u16* att) {                                                                        \
    flash_prefill_t<HD, T>(qkv, kc, vc, pos, ntok, n_head, n_kv_head, scale, att);                         \
  }
#ifndef MENS_BATCH_MODULE
FLASH_PREFILL(flash_prefill64, 64, T_F16)
FLASH_PREFILL(flash_prefill128, 128, T_F16)
FLASH_PREFILL(flash_prefill64_q8, 64, T_Q8_0)
FLASH_PREFILL(flash_prefill128_q8, 128, T_Q8_0)
FLASH_PREFILL(flash_prefill64_q4, 64, T_Q4_0)
FLASH_PREFILL(flash_prefill128_q4, 128, T_Q4_0)
#endif

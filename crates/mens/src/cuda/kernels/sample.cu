// Greedy: argmax of the logits (first index on ties), one kernel: each block reduces its part, the
// last block to finish reduces the partials, writes the token (input of the next step and the
// value the host reads) and advances pos by `advance`.
#ifndef MENS_BATCH_MODULE
extern "C" __global__ void argmax(const float* x, int n, float2* partial, u32* counter, int* tok,
                                  int* out, int* pos, int advance) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ bool last;
  pdl_wait();
  float v;
  int idx;
  am_block(x, n, v, idx, bv, bi);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = make_float2(v, __int_as_float(idx));
    __threadfence();
    last = atomicAdd(counter, 1) == gridDim.x - 1;
  }
  __syncthreads();
#ifdef ARGMAX_SERIAL  // for measuring: the last block's thread 0 reads the partials one by one
  if (last && threadIdx.x == 0) {
    __threadfence();
    float2 b = __ldcg(&partial[0]);
    for (int k = 1; k < gridDim.x; k++) {
      float2 c = __ldcg(&partial[k]);
      if (am_first(c.x, __float_as_int(c.y), b.x, __float_as_int(b.y))) b = c;
    }
    idx = __float_as_int(b.y);
#else
  if (last && threadIdx.x < 32) {
    __threadfence();
    am_partials(partial, gridDim.x, v, idx);
#endif
    if (threadIdx.x == 0) {
      int r = idx;
      if (r < 0 || r >= n) r = 0;  // only when every logit is NaN
      *tok = r;
      *out = r;
      *pos += advance;
      *counter = 0;
    }
  }
}
#endif

// Sampling, step 1: each block keeps the top K (value desc, index asc) of its slice of the logits.
#define KMAX 64
// The block's first (value desc, index asc: am_first) of every thread's (v, idx), returned to every
// thread. wv, wi: shared scratch of 32 entries.
__device__ void block_best(float& v, int& idx, float* wv, int* wi) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  am_warp(v, idx);
  if (lane == 0) { wv[w] = v; wi[w] = idx; }
  __syncthreads();
  v = wv[0]; idx = wi[0];
  for (int j = 1; j < nw; j++)
    if (am_first(wv[j], wi[j], v, idx)) { v = wv[j]; idx = wi[j]; }
  __syncthreads();
}
#ifndef MENS_BATCH_MODULE
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
      if (am_first(pv, pi, y, i) && am_first(y, i, v, idx)) { v = y; idx = i; }
    }
    block_best(v, idx, wv, wi);
    if (threadIdx.x == 0) cand[blockIdx.x * k + r] = make_float2(v, __int_as_float(idx));
    pv = v; pi = idx;
  }
}
#endif

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
#ifndef MENS_BATCH_MODULE
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
      if (ci != 0x7fffffff && am_first(pv, pi, c.x, ci) && am_first(c.x, ci, v, idx)) { v = c.x; idx = ci; }
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
#endif


// Repetition penalties on one logits row, as llama.cpp applies them (and sample.rs's host sampler,
// bit for bit: no contraction into FMAs): for each of n distinct recent tokens (id, count), a
// positive logit is divided by `repeat`, a negative one multiplied, then count × freq + presence
// is taken off.
#ifndef MENS_BATCH_MODULE
extern "C" __global__ void penalize(float* logits, int vocab, const int2* pairs, int n, float repeat,
                                    float freq, float presence) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int id = pairs[i].x;
  if (id < 0 || id >= vocab) return;
  float l = logits[id];
  l = l > 0.f ? __fdiv_rn(l, repeat) : __fmul_rn(l, repeat);
  logits[id] = __fsub_rn(l, __fadd_rn(__fmul_rn((float)pairs[i].y, freq), presence));
}
#endif

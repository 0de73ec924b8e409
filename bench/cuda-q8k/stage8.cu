// A probe, not part of the engine (issue 18: the GPU verify pass). The engine's 8-row dp4a tile
// (kernels/batch.cu, matmul_q8_8) reads the 7B's gate at 1,200 GB/s where decode's kernels read
// 2,250. A count of what its loads cost: lane l takes chunk 32 i + l, two 16-byte activation loads
// a chunk 32 bytes apart, so a warp's load spans 1 KB (8 L1 wavefronts for 512 useful bytes, 4 at
// best), and a step of 2 weight rows x 8 activation rows takes 8 x (2 x 8 + 2) = 144 wavefronts:
// for the 7B's gate (33k warp steps over 132 SMs, one wavefront a clock) about 21 us of L1 time
// alone, against 17 us for decode's read of the weights.
//
// Here: the same arithmetic (W32 and finish, acc[i][j] += chunk by chunk in increasing order, then
// warp_sum: so each activation row gets the 1-row kernel's bits), with the batch's 8 activation
// rows staged once a block into shared memory, each 32-chunk group's first 16-byte halves in one
// 512-byte run and its second halves in the next (lane l reads 16 l: 4 wavefronts a load, 80 a
// step), the weights loaded a chunk ahead (Raw, as decode), R weight rows a warp, and a grid of a
// few blocks an SM that walks the row groups (the staging paid once a block).
#define S8_N 8

// Shared memory: activations [S8_N][G][2][32] int4, scales [S8_N][G][32] float2 (G: 32-chunk
// groups of a row, the last padded).
__host__ __device__ constexpr int s8_groups(int nch) { return (nch + 31) / 32; }

template <int T, int R>
__device__ void s8_matmul_t(const u8* w, u64 row_bytes, int rows, int cols, const i8* aq, const float2* ad, int B,
                            float* out, int ldo) {
  extern __shared__ int4 s8_sm[];
  int nch = cols / 32, G = s8_groups(nch);
  int4* sa = s8_sm;
  float2* sd = (float2*)(sa + S8_N * G * 64);
  for (int i = threadIdx.x; i < S8_N * nch * 2; i += blockDim.x) {
    int j = i / (2 * nch), rem = i - j * 2 * nch, c = rem >> 1, h = rem & 1;
    int b = min(j, B - 1);  // rows past B: row B - 1 again (never written)
    sa[((j * G + (c >> 5)) * 2 + h) * 32 + (c & 31)] = ((const int4*)(aq + (u64)b * cols))[2 * c + h];
  }
  for (int i = threadIdx.x; i < S8_N * nch; i += blockDim.x) {
    int j = i / nch, c = i - j * nch;
    sd[(j * G + (c >> 5)) * 32 + (c & 31)] = ad[(u64)min(j, B - 1) * nch + c];
  }
  __syncthreads();
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int ngroups = (rows + R - 1) / R;
  for (int p = blockIdx.x * nw + (threadIdx.x >> 5); p < ngroups; p += gridDim.x * nw) {
    const u8* rw[R];
#pragma unroll
    for (int i = 0; i < R; i++) rw[i] = w + (u64)min(p * R + i, rows - 1) * row_bytes;
    float acc[R][S8_N];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
      for (int j = 0; j < S8_N; j++) acc[i][j] = 0.f;
    Raw<T> raw[R];
    if (lane < nch)
#pragma unroll
      for (int i = 0; i < R; i++) raw_load<T>(raw[i], rw[i], lane, nch);
    for (int c = lane; c < nch; c += 32) {
      W32 wv[R];
#pragma unroll
      for (int i = 0; i < R; i++) raw_unpack<T>(raw[i], wv[i]);
      if (c + 32 < nch)
#pragma unroll
        for (int i = 0; i < R; i++) raw_load<T>(raw[i], rw[i], c + 32, nch);
      int g = c >> 5;
      constexpr int GA = 4;  // activation rows whose loads are issued together
#pragma unroll
      for (int j0 = 0; j0 < S8_N; j0 += GA) {
        int4 a0[GA], a1[GA];
        float2 ds[GA];
#pragma unroll
        for (int k = 0; k < GA; k++) {
          int base = ((j0 + k) * G + g) * 2 * 32;
          a0[k] = sa[base + lane];
          a1[k] = sa[base + 32 + lane];
          ds[k] = sd[((j0 + k) * G + g) * 32 + lane];
        }
#pragma unroll
        for (int k = 0; k < GA; k++)
#pragma unroll
          for (int i = 0; i < R; i++)
            acc[i][j0 + k] += finish<T>(wv[i], dot16(wv[i].q, a0[k]), dot16(wv[i].q + 4, a1[k]), ds[k].x, ds[k].y);
      }
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
      for (int j = 0; j < S8_N; j++) acc[i][j] = warp_sum(acc[i][j]);
    // Lane i * S8_N + j writes weight row p R + i, activation row j.
    int i = lane / S8_N, j = lane % S8_N, r = p * R + i;
    if (lane < R * S8_N && j < B && r < rows) out[(u64)j * ldo + r] = pick<S8_N, R>(acc, lane);
  }
}
#define S8_KERNEL(NAME, T, R)                                                                              \
  extern "C" __global__ void __launch_bounds__(512) NAME(const u8* w, u64 rb, int rows, int cols,         \
                                                         const i8* aq, const float2* ad, int B, float* out, \
                                                         int ldo) {                                       \
    s8_matmul_t<T, R>(w, rb, rows, cols, aq, ad, B, out, ldo);                                             \
  }
S8_KERNEL(s8_q4kr_2, T_Q4_KR, 2)
S8_KERNEL(s8_q4kr_4, T_Q4_KR, 4)
S8_KERNEL(s8_q6kr_2, T_Q6_KR, 2)
S8_KERNEL(s8_q6kr_4, T_Q6_KR, 4)

// Read bandwidth at the sizes of the decode kernels' weights: what a kernel that only streams its
// bytes reaches, launched back to back over 28 buffers (a layer's worth each, together far beyond
// L2), as the decode graph launches a layer's kernels. The ceiling a matvec of that size can hope
// for, to put beside `mens bench --profile`'s GB/s.
// `bw-probe rows`: instead, the decode matvec's access pattern (a warp a row) row-major and with a
// block's rows interleaved, one or four loads in flight a lane.
// Build and run on the GPU machine: nvcc -O3 -arch=sm_90 scripts/bw-probe.cu -o /tmp/bw-probe && /tmp/bw-probe [rows]
// (it also compiles without a GPU with scripts/cuda-toolkit.sh's nvcc).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                \
  do {                                                                          \
    cudaError_t e = (x);                                                        \
    if (e != cudaSuccess) {                                                     \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));                  \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

// Each thread keeps U 16-byte loads in flight; the xor keeps the loads live.
template <int U>
__global__ void read_all(const int4* __restrict__ p, size_t n, int* out) {
  int acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    int4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) out[0] = acc;
}

// The decode matvec's pattern: a warp a row, 4 warps a block, each warp reading its row 512 bytes
// (16 a lane) an iteration with PF iterations' loads in flight; with `inter`, the block's 4 rows
// stored interleaved (iteration i of rows 0..3 side by side), so a block's 4 warps read 2 KB
// contiguous where row-major they read 4 pieces a row apart.
template <int PF>
__global__ void rows_read(const int4* __restrict__ base, int rows, int row16, int inter, int* out) {
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = blockIdx.x * 4 + w;
  if (r >= rows) return;
  int iters = row16 / 32;
  const int4* p = inter ? base + (size_t)blockIdx.x * 4 * row16 + w * 32 + lane : base + (size_t)r * row16 + lane;
  int step = inter ? 128 : 32;
  int acc = 0;
  int4 v[PF];
#pragma unroll
  for (int k = 0; k < PF; k++) v[k] = k < iters ? __ldcs(p + k * step) : make_int4(0, 0, 0, 0);
  for (int i = 0; i < iters; i += PF) {
#pragma unroll
    for (int k = 0; k < PF; k++) {
      acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
      if (i + PF + k < iters) v[k] = __ldcs(p + (i + PF + k) * step);
    }
  }
  if (acc == 0x7fffffff) out[0] = acc;
}

const int LAYERS = 28, REPS = 20;

// LAYERS buffers of `bytes` each, filled (their pages touched).
static void alloc_layers(int4** buf, size_t bytes) {
  for (int l = 0; l < LAYERS; l++) {
    CHECK(cudaMalloc(&buf[l], bytes));
    CHECK(cudaMemset(buf[l], l, bytes));
  }
}
static void free_layers(int4** buf) {
  for (int l = 0; l < LAYERS; l++) CHECK(cudaFree(buf[l]));
}
// Microseconds a launch: `go(l)` launches the kernel on buffer l; one warm pass over the buffers,
// then REPS timed ones, back to back.
template <class F>
static double us_per_launch(F go, cudaEvent_t a, cudaEvent_t b) {
  for (int l = 0; l < LAYERS; l++) go(l);
  CHECK(cudaEventRecord(a));
  for (int r = 0; r < REPS; r++)
    for (int l = 0; l < LAYERS; l++) go(l);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e3 / (REPS * LAYERS);
}

static void rows_probe(int* out, cudaEvent_t a, cudaEvent_t b) {
  struct { const char* what; int rows, row_bytes; } shapes[] = {
      {"7B down (Q4_K rows)", 3584, 10752}, {"7B o", 3584, 2048}, {"1.5B down", 1536, 5120}};
  for (auto& sh : shapes) {
    size_t bytes = (size_t)sh.rows * sh.row_bytes;
    int4* buf[LAYERS];
    alloc_layers(buf, bytes);
    for (int rep = 0; rep < 2; rep++)
      for (int v = 0; v < 4; v++) {
        int inter = v & 1, pf = v & 2 ? 4 : 1;
        double us = us_per_launch(
            [&](int l) {
              if (pf == 1) rows_read<1><<<sh.rows / 4, 128>>>(buf[l], sh.rows, sh.row_bytes / 16, inter, out);
              else rows_read<4><<<sh.rows / 4, 128>>>(buf[l], sh.rows, sh.row_bytes / 16, inter, out);
            },
            a, b);
        printf("%-20s %7.2f MB  %-11s %d ahead  %7.2f us/kernel  %6.0f GB/s\n", sh.what, bytes / 1e6,
               inter ? "interleaved" : "row-major", pf, us, bytes / (us * 1e3));
      }
    free_layers(buf);
  }
}

int main(int argc, char** argv) {
  // a layer's bytes of each decode matvec
  struct { const char* what; double mb; } sizes[] = {
      {"7B gate+up", 76.4}, {"7B down", 38.2}, {"7B qkv", 9.29}, {"7B o", 7.22},
      {"1.5B gate+up", 15.5}, {"1.5B down", 7.74}, {"0.5B gate+up", 4.9}};
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int* out;
  CHECK(cudaMalloc(&out, 4));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  if (argc > 1) {  // `rows`: the row patterns only
    rows_probe(out, a, b);
    return 0;
  }
  for (auto& sz : sizes) {
    size_t bytes = (size_t)(sz.mb * 1e6) / 16 * 16, n = bytes / 16;
    int4* buf[LAYERS];
    alloc_layers(buf, bytes);
    for (int bps = 4; bps <= 16; bps *= 2)
      for (int rep = 0; rep < 2; rep++) {
        int grid = sms * bps;
        double us = us_per_launch([&](int l) { read_all<4><<<grid, 256>>>(buf[l], n, out); }, a, b);
        printf("%-14s %7.2f MB  %2d blocks/SM  %7.2f us/kernel  %6.0f GB/s\n", sz.what, bytes / 1e6, bps, us,
               bytes / (us * 1e3));
      }
    free_layers(buf);
  }
  return 0;
}

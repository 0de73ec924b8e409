// What a kernel boundary costs in the decode graph, against a grid barrier inside one persistent
// kernel: P dependent phases, each reading S bytes of "weights" (over a 1 GiB buffer, so they come
// from DRAM as a decode step's do) and the previous phase's G outputs (every block reads them all:
// an all-to-all dependency, as between a matvec and the next), each block writing one output.
//   graph:   P kernels captured in one CUDA graph, replayed (as mens's decode graph);
//   pdl:     the same with programmatic dependent launch (each kernel waits at griddepcontrol.wait);
//   persist: one kernel of G co-resident blocks, the P phases separated by a grid barrier.
// µs a phase = replay time / P. The difference at S = 0 is the boundary's own cost.
// Build and run on the GPU machine: nvcc -O3 -arch=sm_90 scripts/boundary-probe.cu -o /tmp/bp && /tmp/bp
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

static const size_t TOTAL = 1ull << 30;  // bytes of weights the phases walk through
static const int THREADS = 128;

struct Args {
  const int4* w;
  float* io;  // [P + 1][G]: phase p reads row p, writes row p + 1
  unsigned* epoch;
  size_t s16;  // 16-byte words a phase
  int G;
};

// One phase's work for block b of G: its share of the S bytes (4 loads in flight a thread), plus
// the G inputs of the phase before; writes io[p + 1][b].
__device__ __forceinline__ void phase(const Args& a, int p, int P, int b, unsigned ep) {
  __shared__ float red[THREADS / 32];
  float in = 0.f;
  const float* prev = a.io + (size_t)p * a.G;
  for (int i = threadIdx.x; i < a.G; i += THREADS) in += __ldcg(prev + i);
  int acc = 0;
  size_t words = TOTAL / 16;
  size_t start = (((size_t)ep * P + p) * a.s16) % (words - a.s16);
  size_t stride = (size_t)a.G * THREADS;
  size_t i = (size_t)b * THREADS + threadIdx.x;
  for (; i + 3 * stride < a.s16; i += 4 * stride) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = __ldcs(a.w + start + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < a.s16; i += stride) {
    int4 v = __ldcs(a.w + start + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  float x = in + (float)(acc & 1);
  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < THREADS / 32; k++) s += red[k];
    __stcg(a.io + (size_t)(p + 1) * a.G + b, s * 1e-9f);
  }
  __syncthreads();
}

__global__ void one_phase(Args a, int p, int P, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned ep = __ldcg(a.epoch);
  phase(a, p, P, blockIdx.x, ep);
  if (p == P - 1 && blockIdx.x == 0 && threadIdx.x == 0) *a.epoch = ep + 1;
}

// Grid barrier: a counter that only grows; block b waits until every block has arrived k times.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1);
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

__global__ void persistent(Args a, int P, unsigned* count) {
  unsigned ep = __ldcg(a.epoch);
  unsigned base = ep * (unsigned)P * gridDim.x;
  for (int p = 0; p < P; p++) {
    phase(a, p, P, blockIdx.x, ep);
    grid_barrier(count, base + (unsigned)(p + 1) * gridDim.x);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.epoch = ep + 1;
}

int main() {
  const int P = 120, REPS = 50;
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int per_sm;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent, THREADS, 0));
  int4* w;
  float* io;
  unsigned *epoch, *count;
  CHECK(cudaMalloc(&w, TOTAL));
  CHECK(cudaMemset(w, 1, TOTAL));
  CHECK(cudaMalloc(&epoch, 4));
  CHECK(cudaMalloc(&count, 4));
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  printf("H200 probe: %d SMs, persistent kernel co-resident blocks/SM %d, %d phases, %d replays\n", sms, per_sm,
         P, REPS);
  printf("%8s %6s %10s %10s %10s   (µs a phase)\n", "bytes", "blocks", "graph", "pdl", "persist");
  const size_t sizes[] = {0, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  const int grids[] = {132, 264, 528};
  for (size_t S : sizes) {
    for (int G : grids) {
      if (G > sms * per_sm) continue;
      CHECK(cudaMalloc(&io, (size_t)(P + 1) * G * 4));
      CHECK(cudaMemset(io, 0, (size_t)(P + 1) * G * 4));
      Args a{w, io, epoch, S / 16, G};
      float us[3];
      for (int mode = 0; mode < 3; mode++) {
        CHECK(cudaMemset(epoch, 0, 4));
        CHECK(cudaMemset(count, 0, 4));
        cudaGraphExec_t exec = nullptr;
        if (mode < 2) {
          cudaGraph_t g;
          CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
          for (int p = 0; p < P; p++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(G);
            cfg.blockDim = dim3(THREADS);
            cfg.stream = st;
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = attr;
            cfg.numAttrs = mode == 1 ? 1 : 0;
            CHECK(cudaLaunchKernelEx(&cfg, one_phase, a, p, P, mode));
          }
          CHECK(cudaStreamEndCapture(st, &g));
          CHECK(cudaGraphInstantiate(&exec, g, 0));
          CHECK(cudaGraphDestroy(g));
        }
        auto run = [&]() {
          if (exec) {
            CHECK(cudaGraphLaunch(exec, st));
          } else {
            persistent<<<G, THREADS, 0, st>>>(a, P, count);
            CHECK(cudaGetLastError());
          }
        };
        for (int r = 0; r < 5; r++) run();
        CHECK(cudaEventRecord(e0, st));
        for (int r = 0; r < REPS; r++) run();
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        us[mode] = ms * 1000.f / (REPS * P);
        if (exec) CHECK(cudaGraphExecDestroy(exec));
      }
      printf("%8zu %6d %10.2f %10.2f %10.2f\n", S, G, us[0], us[1], us[2]);
      CHECK(cudaFree(io));
    }
  }
  return 0;
}

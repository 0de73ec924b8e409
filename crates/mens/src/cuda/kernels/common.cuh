// mens CUDA kernels, compiled at run time by NVRTC (no toolkit needed to build mens).
// Every kernel has a CPU reference in cuda/reference.rs; tests compare them on random inputs.
//
// Conventions
// - Weights stay in their GGUF block formats; a row of `cols` values is `row_bytes` bytes.
// - Decode activations are quantized to "q8": int8 values in blocks of 32 (aq) with one float2
//   (d, s) per block (ad), d = max|x| / 127 and s = d * sum(q). Dot products use dp4a.
// - f16 values are stored as raw u16 and converted with PTX cvt (no cuda_fp16.h needed).
// - `pos` (tokens already in the cache) lives in device memory so a captured graph stays valid.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

#define SPLIT 64      // keys per attention split (decode)
#define MAXG 8        // query heads per KV head
#define NEG_INF (-1e30f)

__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ int dp4a(int a, int b, int c) {
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// u32 from a 2-byte aligned address (blocks of 18, 22, 34, 210 bytes are only 2-aligned).
__device__ __forceinline__ int ld2(const u8* p) {
  const u16* q = (const u16*)p;
  return (int)((u32)q[0] | ((u32)q[1] << 16));
}
__device__ __forceinline__ int ld4(const u8* p) { return *(const int*)p; }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}
// Signed bytes v - 32 for bytes v in 0..63, without borrows between bytes.
__device__ __forceinline__ int sub32(int v) {
  u32 n = ~(u32)v & 0x20202020u;
  return (int)(((u32)v ^ 0x20202020u) | (n << 1) | (n << 2));
}
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}


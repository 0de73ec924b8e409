// A probe, not part of the engine: what Q4_K matrix products cost when the activations have one
// scale per 256 values (llama.cpp's Q8_K, as mens's CPU kernels use) and the weights' sub-block
// scales are applied in integers, so that a (weight row, activation row) pair needs one float
// term per 256 values instead of one per 32 (issue 18: the verify pass; docs/benchmarks.md,
// session 54). Appended to the batch module's sources (kernels/*.cu, -DMENS_BATCH_MODULE) by
// build.py, so the engine's own batch kernels are timed beside it from the same PTX.
//
// Activations ("q8k"): aq, int8 values, row b at aq + b * cols; dk, one float per 256 values
// (max |x| / 127); bs, each 32 values' sum of int8 values (int). A superblock s of weight row r
// against activation row b gives
//   term = (d * da) * isum - (dmin * da) * msum,  isum = sum_j sc_j * (q_j . a_j),  msum = sum_j m_j * bs_j
// (rounded multiplies, no contraction: both kernels make the same bits), and a row's result is
// (S0 + S2) + (S1 + S3), S_g the sum over superblocks s = g mod 4 in increasing s. The
// single-row kernel and the 8-row one follow this order, so a row's bits do not depend on the
// kernel (checked by probe.py).

__device__ __forceinline__ float q8k_term(float dw, float dmw, float da, int isum, int msum) {
  return __fsub_rn(__fmul_rn(__fmul_rn(dw, da), (float)isum), __fmul_rn(__fmul_rn(dmw, da), (float)msum));
}

// One row a warp, 4 rows a block: lane l takes chunk 32k + l, so lanes 8g .. 8g + 7 hold one
// superblock (4k + g); their integer sums are summed by shuffles (exact, in any order), and lane 8g
// adds the superblock's term to stream g. Each lane loads its next chunk before it works on this one.
extern "C" __global__ void __launch_bounds__(128) q8k_matvec_q4k(const u8* w, u64 row_bytes, int rows, int cols,
                                                                 const i8* aq, const float* dk, const int* bs,
                                                                 float* out) {
  int lane = threadIdx.x & 31, r = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= rows) return;
  const u8* row = w + (u64)r * row_bytes;
  int nchunks = cols / 32;
  const u32 M = 0x0F0F0F0Fu;
  float acc = 0.f;
  int4 h = make_int4(0, 0, 0, 0), x0 = h, x1 = h;
  if (lane < nchunks) {
    const u8* b = row + (lane >> 3) * 144;
    h = *(const int4*)b;
    const int4* q4 = (const int4*)(b + 16 + ((lane & 7) >> 1) * 32);
    x0 = q4[0];
    x1 = q4[1];
  }
  for (int base = 0; base < nchunks; base += 32) {
    int c = base + lane;
    bool ok = c < nchunks;
    int4 ch = h, c0 = x0, c1 = x1;
    int n = c + 32;
    if (n < nchunks) {
      const u8* b = row + (n >> 3) * 144;
      h = *(const int4*)b;
      const int4* q4 = (const int4*)(b + 16 + ((n & 7) >> 1) * 32);
      x0 = q4[0];
      x1 = q4[1];
    }
    int is = 0, ms = 0;
    float dw = 0.f, dmw = 0.f, da = 0.f;
    if (ok) {
      int sub = c & 7, sh = (sub & 1) * 4;
      const int4* ap = (const int4*)(aq + c * 32);
      int4 a0 = ap[0], a1 = ap[1];
      int s = 0;
      s = dp4a(((u32)c0.x >> sh) & M, a0.x, s);
      s = dp4a(((u32)c0.y >> sh) & M, a0.y, s);
      s = dp4a(((u32)c0.z >> sh) & M, a0.z, s);
      s = dp4a(((u32)c0.w >> sh) & M, a0.w, s);
      s = dp4a(((u32)c1.x >> sh) & M, a1.x, s);
      s = dp4a(((u32)c1.y >> sh) & M, a1.y, s);
      s = dp4a(((u32)c1.z >> sh) & M, a1.z, s);
      s = dp4a(((u32)c1.w >> sh) & M, a1.w, s);
      int sc, m;
      q4k_scale_min(ch, sub, &sc, &m);
      is = sc * s;
      ms = m * bs[c];
      dw = h2f((u16)(ch.x & 0xffff));
      dmw = h2f((u16)((u32)ch.x >> 16));
      da = dk[c >> 3];
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      is += __shfl_xor_sync(0xffffffffu, is, o);
      ms += __shfl_xor_sync(0xffffffffu, ms, o);
    }
    if (ok && (lane & 7) == 0) acc = __fadd_rn(acc, q8k_term(dw, dmw, da, is, ms));
  }
  // Lanes 0, 8, 16, 24 hold streams 0..3, the others 0: (S0 + S2) + (S1 + S3) in lane 0.
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 16));
  acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 8));
  if (lane == 0) out[r] = acc;
}

// 16 weight rows x 8 activation rows a block of 4 warps; warp g takes the superblocks s = g mod 4
// (stream g). The chunk dots come from mma.sync m16n8k32 (s8, s32: exact); thread (g, t) of a warp
// loads bytes 8t .. 8t + 7 of each 32-byte nibble pair of weight rows g and g + 8 (k slots 4t.. and
// 16 + 4t.. are values 8t.. and 8t + 4..; the activations are read in the same order), and holds
// D[g][2t], D[g][2t + 1], D[g + 8][2t], D[g + 8][2t + 1]. Activation rows past B repeat row B - 1.
// out is [B][rows].
extern "C" __global__ void __launch_bounds__(128) q8k_mma_q4k(const u8* w, u64 row_bytes, int rows, int cols,
                                                              const i8* aq, const float* dk, const int* bs, int B,
                                                              float* out) {
  __shared__ float red[4][4][32];
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int r0 = blockIdx.x * 16;
  const u8* X = w + (u64)min(r0 + g, rows - 1) * row_bytes;
  const u8* Y = w + (u64)min(r0 + g + 8, rows - 1) * row_bytes;
  int b0 = min(2 * t, B - 1), b1 = min(2 * t + 1, B - 1), ag = min(g, B - 1);
  int nsb = cols / 256, nch = cols / 32;
  const u32 M = 0x0F0F0F0Fu;
  const i8* arow = aq + (u64)ag * cols + 8 * t;
  const int* bs0 = bs + (u64)b0 * nch;
  const int* bs1 = bs + (u64)b1 * nch;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s = wp; s < nsb; s += 4) {
    const u8* bx = X + s * 144;
    const u8* by = Y + s * 144;
    int4 hx = *(const int4*)bx, hy = *(const int4*)by;
    uint2 qx[4], qy[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
      qx[p] = *(const uint2*)(bx + 16 + 32 * p + 8 * t);
      qy[p] = *(const uint2*)(by + 16 + 32 * p + 8 * t);
    }
    int is[4] = {0, 0, 0, 0}, ms[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      int p = j >> 1, sh = (j & 1) * 4;
      uint2 a = *(const uint2*)(arow + (s * 8 + j) * 32);
      int d[4];
      mma_s8_k32(d, (qx[p].x >> sh) & M, (qy[p].x >> sh) & M, (qx[p].y >> sh) & M, (qy[p].y >> sh) & M, a.x, a.y);
      int scx, mx, scy, my;
      q4k_scale_min(hx, j, &scx, &mx);
      q4k_scale_min(hy, j, &scy, &my);
      int v0 = bs0[s * 8 + j], v1 = bs1[s * 8 + j];
      is[0] += scx * d[0];
      is[1] += scx * d[1];
      is[2] += scy * d[2];
      is[3] += scy * d[3];
      ms[0] += mx * v0;
      ms[1] += mx * v1;
      ms[2] += my * v0;
      ms[3] += my * v1;
    }
    float da0 = dk[b0 * nsb + s], da1 = dk[b1 * nsb + s];
    float dx = h2f((u16)(hx.x & 0xffff)), mxf = h2f((u16)((u32)hx.x >> 16));
    float dy = h2f((u16)(hy.x & 0xffff)), myf = h2f((u16)((u32)hy.x >> 16));
    acc[0] = __fadd_rn(acc[0], q8k_term(dx, mxf, da0, is[0], ms[0]));
    acc[1] = __fadd_rn(acc[1], q8k_term(dx, mxf, da1, is[1], ms[1]));
    acc[2] = __fadd_rn(acc[2], q8k_term(dy, myf, da0, is[2], ms[2]));
    acc[3] = __fadd_rn(acc[3], q8k_term(dy, myf, da1, is[3], ms[3]));
  }
#pragma unroll
  for (int e = 0; e < 4; e++) red[wp][e][lane] = acc[e];
  __syncthreads();
  if (wp == 0) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = __fadd_rn(__fadd_rn(red[0][e][lane], red[2][e][lane]), __fadd_rn(red[1][e][lane], red[3][e][lane]));
      int r = r0 + g + (e >> 1) * 8, b = 2 * t + (e & 1);
      if (r < rows && b < B) out[(u64)b * rows + r] = v;
    }
  }
}

// Dequantize the c-th 32-value chunk of a row into 32 floats.
template <int T>
__device__ void deq32(const u8* row, int c, float* y);
template <>
__device__ void deq32<T_Q8_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 34;
  float d = h2f(*(const u16*)b);
  for (int i = 0; i < 32; i++) y[i] = d * (float)(i8)b[2 + i];
}
template <>
__device__ void deq32<T_Q4_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 18;
  float d = h2f(*(const u16*)b);
  for (int i = 0; i < 16; i++) {
    y[i] = d * (float)((b[2 + i] & 0xF) - 8);
    y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
  }
}
template <>
__device__ void deq32<T_Q4_1>(const u8* row, int c, float* y) {
  const u8* b = row + c * 20;
  float d = h2f(*(const u16*)b), m = h2f(*(const u16*)(b + 2));
  for (int i = 0; i < 16; i++) {
    y[i] = d * (float)(b[4 + i] & 0xF) + m;
    y[i + 16] = d * (float)(b[4 + i] >> 4) + m;
  }
}
// A Q5_0 block's values from its 16 nibble bytes qs, its 32 high bits and its scale (both layouts).
__device__ void deq_q5_0(const u8* qs, u32 qh, float d, float* y) {
  for (int i = 0; i < 16; i++) {
    int h0 = (int)((qh >> i) & 1), h1 = (int)((qh >> (i + 16)) & 1);
    y[i] = d * (float)(((qs[i] & 0xF) | (h0 << 4)) - 16);
    y[i + 16] = d * (float)(((qs[i] >> 4) | (h1 << 4)) - 16);
  }
}
template <>
__device__ void deq32<T_Q5_0>(const u8* row, int c, float* y) {
  const u8* b = row + c * 22;
  deq_q5_0(b + 6, (u32)ld2(b + 2), h2f(*(const u16*)b), y);
}
template <>
__device__ void deq32<T_Q5_1>(const u8* row, int c, float* y) {
  const u8* b = row + c * 24;
  float d = h2f(*(const u16*)b), m = h2f(*(const u16*)(b + 2));
  u32 qh = (u32)ld4(b + 4);
  for (int i = 0; i < 16; i++) {
    int h0 = (int)((qh >> i) & 1), h1 = (int)((qh >> (i + 16)) & 1);
    y[i] = d * (float)((b[8 + i] & 0xF) | (h0 << 4)) + m;
    y[i + 16] = d * (float)((b[8 + i] >> 4) | (h1 << 4)) + m;
  }
}
template <>
__device__ void deq32<T_Q4_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 144;
  int sub = c & 7, sc, m;
  scale_min_k4(sub, b + 4, &sc, &m);
  float d = h2f(*(const u16*)b) * sc, mn = h2f(*(const u16*)(b + 2)) * m;
  const u8* qs = b + 16 + (sub >> 1) * 32;
  int shift = (sub & 1) * 4;
  for (int i = 0; i < 32; i++) y[i] = d * (float)((qs[i] >> shift) & 0xF) - mn;
}
template <>
__device__ void deq32<T_Q5_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 176;
  int sub = c & 7, sc, m;
  scale_min_k4(sub, b + 4, &sc, &m);
  float d = h2f(*(const u16*)b) * sc, mn = h2f(*(const u16*)(b + 2)) * m;
  const u8* qh = b + 16;
  const u8* qs = b + 48 + (sub >> 1) * 32;
  int shift = (sub & 1) * 4;
  for (int i = 0; i < 32; i++) y[i] = d * (float)(((qs[i] >> shift) & 0xF) | (((qh[i] >> sub) & 1) << 4)) - mn;
}
template <>
__device__ void deq32<T_Q6_K>(const u8* row, int c, float* y) {
  const u8* b = row + (c >> 3) * 210;
  int sub = c & 7, n = sub >> 2, g = sub & 3;
  const u8* ql = b + n * 64 + (g & 1) * 32;
  const u8* qh = b + 128 + n * 32;
  const i8* sc = (const i8*)(b + 192) + n * 8 + 2 * g;
  float d = h2f(*(const u16*)(b + 208));
  int lsh = (g >> 1) * 4, hsh = 2 * g;
  for (int i = 0; i < 32; i++) {
    int q = (((ql[i] >> lsh) & 0xF) | (((qh[i] >> hsh) & 3) << 4)) - 32;
    y[i] = d * (float)sc[i >> 4] * (float)q;
  }
}
template <>
__device__ void deq32<T_F16>(const u8* row, int c, float* y) {
  const u16* w = (const u16*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = h2f(w[i]);
}
template <>
__device__ void deq32<T_BF16>(const u8* row, int c, float* y) {
  const u16* w = (const u16*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = __int_as_float((int)((u32)w[i] << 16));
}
template <>
__device__ void deq32<T_F32>(const u8* row, int c, float* y) {
  const float* w = (const float*)row + c * 32;
  for (int i = 0; i < 32; i++) y[i] = w[i];
}
// The repacked types (n: the row's chunks), through unpack32: the GGUF types' expressions above.
__device__ void deq32_q4kr(const u8* row, int c, float* y, int n) {
  W32 w;
  unpack32<T_Q4_KR>(row, c, w, n);
  float d = w.a * (float)w.s0, mn = w.b * (float)w.s1;
  for (int i = 0; i < 32; i++) y[i] = d * (float)((w.q[i >> 2] >> (8 * (i & 3))) & 0xF) - mn;
}
__device__ void deq32_q6kr(const u8* row, int c, float* y, int n) {
  W32 w;
  unpack32<T_Q6_KR>(row, c, w, n);
  for (int i = 0; i < 32; i++) {
    int q = (int)(i8)(w.q[i >> 2] >> (8 * (i & 3)));
    y[i] = w.a * (float)(i < 16 ? w.s0 : w.s1) * (float)q;
  }
}
// Q5_0R and Q8_0R: the GGUF blocks' expressions, from the chunk's parts.
__device__ void deq32_q5_0r(const u8* row, int c, float* y, int n) {
  deq_q5_0(row + 16 * c, *(const u32*)(row + 16 * n + 4 * c), h2f(*(const u16*)(row + 20 * n + 2 * c)), y);
}
__device__ void deq32_q8_0r(const u8* row, int c, float* y, int n) {
  const u8* q = row + 32 * c;
  float d = h2f(*(const u16*)(row + 32 * n + 2 * c));
  for (int i = 0; i < 32; i++) y[i] = d * (float)(i8)q[i];
}
__device__ void deq(int type, const u8* row, int c, float* y, int n) {
  switch (type) {
    case T_Q5_0R: deq32_q5_0r(row, c, y, n); break;
    case T_Q8_0R: deq32_q8_0r(row, c, y, n); break;
    case T_Q4_KR: deq32_q4kr(row, c, y, n); break;
    case T_Q6_KR: deq32_q6kr(row, c, y, n); break;
    case T_Q4_K: deq32<T_Q4_K>(row, c, y); break;
    case T_Q6_K: deq32<T_Q6_K>(row, c, y); break;
    case T_Q5_0: deq32<T_Q5_0>(row, c, y); break;
    case T_Q8_0: deq32<T_Q8_0>(row, c, y); break;
    case T_Q4_0: deq32<T_Q4_0>(row, c, y); break;
    case T_Q4_1: deq32<T_Q4_1>(row, c, y); break;
    case T_Q5_1: deq32<T_Q5_1>(row, c, y); break;
    case T_Q5_K: deq32<T_Q5_K>(row, c, y); break;
    case T_F16: deq32<T_F16>(row, c, y); break;
    case T_BF16: deq32<T_BF16>(row, c, y); break;
    default: deq32<T_F32>(row, c, y); break;
  }
}

// W (rows x cols, quantized) -> f16 row-major, one thread per 32-value chunk (prefill GEMMs).
extern "C" __global__ void dequant_f16(Seg s, int cols, u16* out) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  int per_row = cols / 32;
  if (i >= (u64)s.rows * per_row) return;
  u64 r = i / per_row;
  int c = (int)(i % per_row);
  float y[32];
  deq(s.type, s.w + r * s.row_bytes, c, y, per_row);
  uint4* o = (uint4*)(out + r * cols + c * 32);  // 64 bytes, 16-byte stores
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const float* v = y + 8 * k;
    uint4 u;
    u.x = (u32)f2h(v[0]) | ((u32)f2h(v[1]) << 16);
    u.y = (u32)f2h(v[2]) | ((u32)f2h(v[3]) << 16);
    u.z = (u32)f2h(v[4]) | ((u32)f2h(v[5]) << 16);
    u.w = (u32)f2h(v[6]) | ((u32)f2h(v[7]) << 16);
    o[k] = u;
  }
}

// x[t] = embedding row of toks[t] (f32). Grid: tokens; block: chunks of the row.
extern "C" __global__ void embed(Seg s, int cols, const int* toks, float* x) {
  pdl_wait();
  int t = blockIdx.x;
  const u8* row = s.w + (u64)toks[t] * s.row_bytes;
  float y[32];
  for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
    deq(s.type, row, c, y, cols / 32);
    for (int k = 0; k < 32; k++) x[(u64)t * cols + c * 32 + k] = y[k];
  }
}

// Q/K/V bias, RoPE on Q and K, K and V into the f16 cache at positions pos0 + t (with kc = 0, a
// quantized cache: K rotated in place in qkv, where kv_quant or the decode attention kernel
// stores it from; V stays there). Q is rounded to
// f16 (as llama.cpp's flash attention reads it); with qperm it is also written in f16, grouped by
// KV head ([kv_head][t][j][hd]) for the prefill GEMMs. With `rows` (a packed pass of several
// sequences), token t is at position rows[2t] and goes to cache row rows[2t + 1]; else both are
// *pos + t. Grid: tokens; block: 256 threads.
extern "C" __global__ void rope_store(float* qkv, const float* bias, const float* cosv, const float* sinv,
                                      const int* pos, int n_head, int n_kv_head, int hd, int neox,
                                      u16* kc, u16* vc, u16* qperm, int ntok, const int* rows) {
  pdl_wait();
  int t = blockIdx.x;
  int p = rows ? rows[2 * t] : *pos + t;
  u64 cr = rows ? (u64)rows[2 * t + 1] : (u64)p;
  int qd = n_head * hd, kvd = n_kv_head * hd, row = qd + 2 * kvd, half = hd / 2;
  float* r = qkv + (u64)t * row;
  if (bias) {
    for (int i = threadIdx.x; i < row; i += blockDim.x) r[i] += bias[i];
    __syncthreads();
  }
  const float* cs = cosv + (u64)p * half;
  const float* sn = sinv + (u64)p * half;
  int nh = n_head + n_kv_head;
  for (int i = threadIdx.x; i < nh * half; i += blockDim.x) {
    int h = i / half, k = i % half;
    float* v = r + h * hd;  // K heads follow the Q heads
    int a = neox ? k : 2 * k, b = neox ? k + half : 2 * k + 1;
    float x0 = v[a], x1 = v[b];
    float2 y = rope_rot(x0, x1, cs[k], sn[k]);
    float y0 = y.x, y1 = y.y;
    if (h < n_head) {
      u16 h0 = f2h(y0), h1 = f2h(y1);
      v[a] = h2f(h0);
      v[b] = h2f(h1);
      if (qperm) {
        int g = n_head / n_kv_head, kvh = h / g, j = h % g;
        u16* q = qperm + (((u64)kvh * ntok + t) * g + j) * hd;
        q[a] = h0;
        q[b] = h1;
      }
    } else if (!kc) {
      v[a] = y0;
      v[b] = y1;
    } else {
      kc[cr * kvd + (h - n_head) * hd + a] = f2h(y0);
      kc[cr * kvd + (h - n_head) * hd + b] = f2h(y1);
    }
  }
  if (vc)
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) vc[cr * kvd + i] = f2h(r[qd + kvd + i]);
}

// Prefill on a quantized cache (q8_0 / q4_0, see kv_row_bytes): the n rows of K and V left as f32
// in qkv (row stride `row`; K at qd, V at qd + kvd) into cache rows *pos + t (with `rows`, a
// packed pass: rows[2t + 1]), with ggml's rounding. (Decode stores its row in the attention
// kernel.) Grid (n, 2): K, then V; block 256, a warp per block of 32 values.
template <int T>
__device__ void kv_quant_t(const float* qkv, int row, int qd, int kvd, const int* pos, u8* kc, u8* vc,
                           const int* rows) {
  int t = blockIdx.x;
  const float* src = qkv + (u64)t * row + qd + blockIdx.y * kvd;
  u64 cr = rows ? (u64)rows[2 * t + 1] : (u64)(*pos + t);
  u8* dst = (blockIdx.y ? vc : kc) + cr * kv_row_bytes(T, kvd);
  int lane = threadIdx.x & 31;
  for (int j = threadIdx.x >> 5; j < kvd / 32; j += blockDim.x >> 5)
    kv_store_block<T>(src[j * 32 + lane], dst, kvd, j, lane);
}
extern "C" __global__ void kv_quant_q8(const float* qkv, int row, int qd, int kvd, const int* pos, u8* kc, u8* vc,
                                       const int* rows) {
  kv_quant_t<T_Q8_0>(qkv, row, qd, kvd, pos, kc, vc, rows);
}
extern "C" __global__ void kv_quant_q4(const float* qkv, int row, int qd, int kvd, const int* pos, u8* kc, u8* vc,
                                       const int* rows) {
  kv_quant_t<T_Q4_0>(qkv, row, qd, kvd, pos, kc, vc, rows);
}


// Prefill on a quantized cache: the first `rows` rows of a layer's K and V as f16 [rows][kvd]
// for the cuBLAS attention (llama.cpp's CUDA flash attention converts a quantized cache to f16
// the same way for batches of queries). Grid (rows, 2); block 128, four values a thread.
// The rows come back from the cache's rotation (hadamard32): a warp a block of 32 values.
template <int T>
__device__ void kv_to_f16_t(const u8* kc, const u8* vc, int kvd, u16* k16, u16* v16) {
  u64 r = blockIdx.x;
  const u8* row = (blockIdx.y ? vc : kc) + r * kv_row_bytes(T, kvd);
  u16* out = (blockIdx.y ? v16 : k16) + r * kvd;
  int lane = threadIdx.x & 31;
  for (int d = threadIdx.x; d < kvd; d += blockDim.x) {
    float4 x4 = kv_get4<T>(row, kvd, d & ~3);
    float x = (d & 3) == 0 ? x4.x : (d & 3) == 1 ? x4.y : (d & 3) == 2 ? x4.z : x4.w;
    out[d] = f2h(hadamard32(x, lane));
  }
}
extern "C" __global__ void kv_to_f16_q8(const u8* kc, const u8* vc, int kvd, u16* k16, u16* v16) {
  kv_to_f16_t<T_Q8_0>(kc, vc, kvd, k16, v16);
}
extern "C" __global__ void kv_to_f16_q4(const u8* kc, const u8* vc, int kvd, u16* k16, u16* v16) {
  kv_to_f16_t<T_Q4_0>(kc, vc, kvd, k16, v16);
}

// Cache reuse across edits: `len` f16 K rows (kvd values each, heads of hd) read from `src` (a copy
// of the rows before the move), rotated by `delta` positions and stored at `dst`: RoPE of position
// p + delta is RoPE(delta) after RoPE(p), so a key moves without being computed again (as the CPU's
// RopeTable::rotate_by: the table row |delta|, sin negated for a move back). Grid: rows; block 256.
extern "C" __global__ void shift_k(const u16* src, u16* dst, int kvd, int hd, int neox,
                                   const float* cosv, const float* sinv, int delta) {
  int t = blockIdx.x, half = hd / 2;
  int p = delta < 0 ? -delta : delta;
  float sign = delta < 0 ? -1.f : 1.f;
  const float* cs = cosv + (u64)p * half;
  const float* sn = sinv + (u64)p * half;
  const u16* r = src + (u64)t * kvd;
  u16* o = dst + (u64)t * kvd;
  for (int i = threadIdx.x; i < kvd / 2; i += blockDim.x) {
    int h = i / half, k = i % half;
    int a = h * hd + (neox ? k : 2 * k), b = h * hd + (neox ? k + half : 2 * k + 1);
    float x0 = h2f(r[a]), x1 = h2f(r[b]), si = sign * sn[k];
    float2 y = rope_rot(x0, x1, cs[k], si);
    o[a] = f2h(y.x);
    o[b] = f2h(y.y);
  }
}

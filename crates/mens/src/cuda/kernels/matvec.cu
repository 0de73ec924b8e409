// ---------------------------------------------------------------------------------------------
// Dot product of the c-th 32-value chunk of a weight row with 32 q8 activations (aq, d8, s8).

template <int T>
__device__ __forceinline__ float dot32(const u8* row, int c, const int* a, float d8, float s8, int n);

template <>
__device__ __forceinline__ float dot32<T_Q8_0>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + c * 34;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) s = dp4a(ld2(b + 2 + 4 * i), a[i], s);
  return h2f(*(const u16*)b) * d8 * (float)s;
}
template <>
__device__ __forceinline__ float dot32<T_Q4_0>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + c * 18;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld2(b + 2 + 4 * i);
    s = dp4a(w & 0x0F0F0F0F, a[i], s);
    s = dp4a((w >> 4) & 0x0F0F0F0F, a[4 + i], s);
  }
  return h2f(*(const u16*)b) * (d8 * (float)s - 8.f * s8);
}
template <>
__device__ __forceinline__ float dot32<T_Q4_1>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + c * 20;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld4(b + 4 + 4 * i);
    s = dp4a(w & 0x0F0F0F0F, a[i], s);
    s = dp4a((w >> 4) & 0x0F0F0F0F, a[4 + i], s);
  }
  return h2f(*(const u16*)b) * d8 * (float)s + h2f(*(const u16*)(b + 2)) * s8;
}
__device__ __forceinline__ int spread4(u32 h) {  // 4 bits -> bit 4 of each byte
  return (int)(((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25));
}
template <>
__device__ __forceinline__ float dot32<T_Q5_0>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + c * 22;
  u32 qh = (u32)ld2(b + 2);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld2(b + 6 + 4 * i);
    s = dp4a((w & 0x0F0F0F0F) | spread4(qh >> (4 * i)), a[i], s);
    s = dp4a(((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i)), a[4 + i], s);
  }
  return h2f(*(const u16*)b) * (d8 * (float)s - 16.f * s8);
}
template <>
__device__ __forceinline__ float dot32<T_Q5_1>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + c * 24;
  u32 qh = (u32)ld4(b + 4);
  int s = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int w = ld4(b + 8 + 4 * i);
    s = dp4a((w & 0x0F0F0F0F) | spread4(qh >> (4 * i)), a[i], s);
    s = dp4a(((w >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i)), a[4 + i], s);
  }
  return h2f(*(const u16*)b) * d8 * (float)s + h2f(*(const u16*)(b + 2)) * s8;
}
template <>
__device__ __forceinline__ float dot32<T_Q4_K>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + (c >> 3) * 144;  // blocks are 16-byte aligned (144 = 9 * 16)
  int sub = c & 7;
  const int4* q4 = (const int4*)(b + 16 + (sub >> 1) * 32);
  int4 h = *(const int4*)b;  // d, dmin, scales[12]
  int4 x0 = q4[0], x1 = q4[1];
  int qs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  int shift = (sub & 1) * 4;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) s = dp4a((qs[i] >> shift) & 0x0F0F0F0F, a[i], s);
  int sc, m;
  q4k_scale_min(h, sub, &sc, &m);
  return h2f((u16)(h.x & 0xffff)) * (float)sc * d8 * (float)s - h2f((u16)((u32)h.x >> 16)) * (float)m * s8;
}
template <>
__device__ __forceinline__ float dot32<T_Q5_K>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + (c >> 3) * 176;  // blocks are 16-byte aligned (176 = 11 * 16)
  int sub = c & 7;
  int4 h = *(const int4*)b;  // d, dmin, scales[12]
  const int* qh = (const int*)(b + 16);
  const int* qs = (const int*)(b + 48 + (sub >> 1) * 32);
  int shift = (sub & 1) * 4;
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++)
    s = dp4a(((qs[i] >> shift) & 0x0F0F0F0F) | ((((u32)qh[i] >> sub) & 0x01010101u) << 4), a[i], s);
  int sc, m;
  q4k_scale_min(h, sub, &sc, &m);
  return h2f((u16)(h.x & 0xffff)) * (float)sc * d8 * (float)s - h2f((u16)((u32)h.x >> 16)) * (float)m * s8;
}
// 8 consecutive u32 from a 2-byte aligned address: 9 aligned loads and funnel shifts instead of
// 16 two-byte loads (Q6_K blocks are 210 bytes, so every other one is only 2-byte aligned).
__device__ __forceinline__ void ld8_a2(const u8* p, int* out) {
  const u32* w = (const u32*)((u64)p & ~(u64)3);
  u32 sh = ((u32)(u64)p & 3) * 8;
  u32 x[9];
#pragma unroll
  for (int i = 0; i < 9; i++) x[i] = w[i];
#pragma unroll
  for (int i = 0; i < 8; i++) out[i] = (int)__funnelshift_r(x[i], x[i + 1], sh);
}
template <>
__device__ __forceinline__ float dot32<T_Q6_K>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u8* b = row + (c >> 3) * 210;
  int sub = c & 7, hf = sub >> 2, g = sub & 3;
  const u8* ql = b + hf * 64 + (g & 1) * 32;
  const u8* qh = b + 128 + hf * 32;
  const i8* sc = (const i8*)(b + 192) + hf * 8 + 2 * g;
  int lsh = (g >> 1) * 4, hsh = 2 * g;
  int l[8], h[8];
  ld8_a2(ql, l);
  ld8_a2(qh, h);
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int v = ((l[i] >> lsh) & 0x0F0F0F0F) | (((h[i] >> hsh) & 0x03030303) << 4);
    s0 = dp4a(sub32(v), a[i], s0);
  }
#pragma unroll
  for (int i = 4; i < 8; i++) {
    int v = ((l[i] >> lsh) & 0x0F0F0F0F) | (((h[i] >> hsh) & 0x03030303) << 4);
    s1 = dp4a(sub32(v), a[i], s1);
  }
  return h2f(*(const u16*)(b + 208)) * d8 * (float)(sc[0] * s0 + sc[1] * s1);
}
__device__ __forceinline__ float a8(const int* a, int i) { return (float)((const i8*)a)[i]; }
template <>
__device__ __forceinline__ float dot32<T_F16>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u16* w = (const u16*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += h2f(w[i]) * a8(a, i);
  return s * d8;
}
template <>
__device__ __forceinline__ float dot32<T_BF16>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const u16* w = (const u16*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += __int_as_float((int)((u32)w[i] << 16)) * a8(a, i);
  return s * d8;
}
template <>
__device__ __forceinline__ float dot32<T_F32>(const u8* row, int c, const int* a, float d8, float s8, int n) {
  const float* w = (const float*)row + c * 32;
  float s = 0.f;
  for (int i = 0; i < 32; i++) s += w[i] * a8(a, i);
  return s * d8;
}

// A 32-value weight chunk unpacked once for all activation rows: its values as signed bytes in 8
// words, and its scales (a, b: floats; s0, s1: integer sub-scales). finish() turns the chunk's two
// 16-value dp4a sums into the float dot32 returns, with dot32's own expression, so that a batch row
// gets the very bits the single-sequence kernels give. Formats without an integer form: false.
struct W32 {
  int q[8];
  float a, b;
  int s0, s1;
};

template <int T>
__device__ __forceinline__ bool unpack32(const u8* row, int c, W32& w, int n) { return false; }
template <int T>
__device__ __forceinline__ float finish(const W32& w, int lo, int hi, float d8, float s8) { return 0.f; }

// A chunk's bytes, loaded into registers one chunk ahead of their use: the row loops below issue
// chunk c + 32's loads before chunk c's arithmetic, so each warp keeps two chunks' weight loads
// in flight (the kernels wait on memory, not on arithmetic): 7B decode 377 -> 404 tokens/s, 1.5B
// 695 -> 811 on the H200; two chunks ahead was slower (393). The main formats (Q4_K, Q6_K, Q5_0,
// Q8_0) load in raw_load; the others keep their address and load in raw_unpack. The unpacked
// values are those unpack32 gives, so the bits do not change. -DNO_PF: no loads ahead.
template <int T>
struct Raw {
  const u8* row;
  int c, n;
};
template <int T>
__device__ __forceinline__ void raw_load(Raw<T>& r, const u8* row, int c, int n) {
  r.row = row;
  r.c = c;
  r.n = n;
}
template <int T>
__device__ __forceinline__ bool raw_unpack(const Raw<T>& r, W32& w) { return unpack32<T>(r.row, r.c, w, r.n); }
#define RAW_UNPACK32(T)                                                     \
  template <>                                                               \
  __device__ __forceinline__ bool unpack32<T>(const u8* row, int c, W32& w, int n) { \
    Raw<T> r;                                                               \
    raw_load<T>(r, row, c, n);                                              \
    return raw_unpack<T>(r, w);                                             \
  }

template <>
struct Raw<T_Q8_0> {
  int q[8];
  u16 d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q8_0>(Raw<T_Q8_0>& r, const u8* row, int c, int n) {
  const u8* b = row + c * 34;
#pragma unroll
  for (int i = 0; i < 8; i++) r.q[i] = ld2(b + 2 + 4 * i);
  r.d = *(const u16*)b;
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q8_0>(const Raw<T_Q8_0>& r, W32& w) {
#pragma unroll
  for (int i = 0; i < 8; i++) w.q[i] = r.q[i];
  w.a = h2f(r.d);
  return true;
}
RAW_UNPACK32(T_Q8_0)
template <>
__device__ __forceinline__ float finish<T_Q8_0>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * d8 * (float)(lo + hi);
}
template <>
__device__ __forceinline__ bool unpack32<T_Q4_0>(const u8* row, int c, W32& w, int n) {
  const u8* b = row + c * 18;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int x = ld2(b + 2 + 4 * i);
    w.q[i] = x & 0x0F0F0F0F;
    w.q[4 + i] = (x >> 4) & 0x0F0F0F0F;
  }
  w.a = h2f(*(const u16*)b);
  return true;
}
template <>
__device__ __forceinline__ float finish<T_Q4_0>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * (d8 * (float)(lo + hi) - 8.f * s8);
}
template <>
__device__ __forceinline__ bool unpack32<T_Q4_1>(const u8* row, int c, W32& w, int n) {
  const u8* b = row + c * 20;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int x = ld4(b + 4 + 4 * i);
    w.q[i] = x & 0x0F0F0F0F;
    w.q[4 + i] = (x >> 4) & 0x0F0F0F0F;
  }
  w.a = h2f(*(const u16*)b);
  w.b = h2f(*(const u16*)(b + 2));
  return true;
}
template <>
__device__ __forceinline__ float finish<T_Q4_1>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * d8 * (float)(lo + hi) + w.b * s8;
}
template <>
struct Raw<T_Q5_0> {
  int x[4];
  u32 qh;
  u16 d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q5_0>(Raw<T_Q5_0>& r, const u8* row, int c, int n) {
  const u8* b = row + c * 22;
  r.qh = (u32)ld2(b + 2);
#pragma unroll
  for (int i = 0; i < 4; i++) r.x[i] = ld2(b + 6 + 4 * i);
  r.d = *(const u16*)b;
}
// A Q5_0 block's values from its 16 bytes of nibbles (x), its 32 high bits and its scale.
__device__ __forceinline__ void unpack_q5_0(const int (&x)[4], u32 qh, u16 d, W32& w) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    w.q[i] = (x[i] & 0x0F0F0F0F) | spread4(qh >> (4 * i));
    w.q[4 + i] = ((x[i] >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
  }
  w.a = h2f(d);
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q5_0>(const Raw<T_Q5_0>& r, W32& w) {
  unpack_q5_0(r.x, r.qh, r.d, w);
  return true;
}
RAW_UNPACK32(T_Q5_0)
template <>
__device__ __forceinline__ float finish<T_Q5_0>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * (d8 * (float)(lo + hi) - 16.f * s8);
}
template <>
__device__ __forceinline__ bool unpack32<T_Q5_1>(const u8* row, int c, W32& w, int n) {
  const u8* b = row + c * 24;
  u32 qh = (u32)ld4(b + 4);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int x = ld4(b + 8 + 4 * i);
    w.q[i] = (x & 0x0F0F0F0F) | spread4(qh >> (4 * i));
    w.q[4 + i] = ((x >> 4) & 0x0F0F0F0F) | spread4(qh >> (16 + 4 * i));
  }
  w.a = h2f(*(const u16*)b);
  w.b = h2f(*(const u16*)(b + 2));
  return true;
}
template <>
__device__ __forceinline__ float finish<T_Q5_1>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * d8 * (float)(lo + hi) + w.b * s8;
}
// A Q4_K block's header (d, dmin, the 6-bit scales) for sub-block `sub`: both layouts share it.
__device__ __forceinline__ void q4k_header(int4 h, int sub, W32& w) {
  q4k_scale_min(h, sub, &w.s0, &w.s1);
  w.a = h2f((u16)(h.x & 0xffff));
  w.b = h2f((u16)((u32)h.x >> 16));
}
template <>
struct Raw<T_Q4_K> {
  int4 h, x0, x1;  // d, dmin, scales[12]; the 32 bytes holding the chunk's nibbles
  int sub;
};
template <>
__device__ __forceinline__ void raw_load<T_Q4_K>(Raw<T_Q4_K>& r, const u8* row, int c, int n) {
  const u8* b = row + (c >> 3) * 144;
  r.sub = c & 7;
  const int4* q4 = (const int4*)(b + 16 + (r.sub >> 1) * 32);
  r.h = *(const int4*)b;
  r.x0 = q4[0];
  r.x1 = q4[1];
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q4_K>(const Raw<T_Q4_K>& r, W32& w) {
  int qs[8] = {r.x0.x, r.x0.y, r.x0.z, r.x0.w, r.x1.x, r.x1.y, r.x1.z, r.x1.w};
  int shift = (r.sub & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; i++) w.q[i] = (qs[i] >> shift) & 0x0F0F0F0F;
  q4k_header(r.h, r.sub, w);
  return true;
}
RAW_UNPACK32(T_Q4_K)
template <>
__device__ __forceinline__ float finish<T_Q4_K>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * (float)w.s0 * d8 * (float)(lo + hi) - w.b * (float)w.s1 * s8;
}
template <>
__device__ __forceinline__ bool unpack32<T_Q5_K>(const u8* row, int c, W32& w, int n) {
  const u8* b = row + (c >> 3) * 176;  // 16-byte aligned blocks
  int sub = c & 7;
  int4 h = *(const int4*)b;
  const int* qh = (const int*)(b + 16);
  const int* qs = (const int*)(b + 48 + (sub >> 1) * 32);
  int shift = (sub & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; i++)
    w.q[i] = ((qs[i] >> shift) & 0x0F0F0F0F) | ((((u32)qh[i] >> sub) & 0x01010101u) << 4);
  q4k_scale_min(h, sub, &w.s0, &w.s1);
  w.a = h2f((u16)(h.x & 0xffff));
  w.b = h2f((u16)((u32)h.x >> 16));
  return true;
}
template <>
__device__ __forceinline__ float finish<T_Q5_K>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * (float)w.s0 * d8 * (float)(lo + hi) - w.b * (float)w.s1 * s8;
}
// Q6_K: the chunk's low and high bits as 9 aligned words each (ld8_a2's loads; blocks of 210
// bytes are only 2-byte aligned), its two scales and d.
template <>
struct Raw<T_Q6_K> {
  u32 l[9], h[9];
  u32 sh;
  int sub;
  u16 sc, d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q6_K>(Raw<T_Q6_K>& r, const u8* row, int c, int n) {
  const u8* b = row + (c >> 3) * 210;
  int sub = c & 7, hf = sub >> 2, g = sub & 3;
  const u8* ql = b + hf * 64 + (g & 1) * 32;
  const u8* qh = b + 128 + hf * 32;  // ql and qh: the same alignment as b
  const u32* wl = (const u32*)((u64)ql & ~(u64)3);
  const u32* wh = (const u32*)((u64)qh & ~(u64)3);
#pragma unroll
  for (int i = 0; i < 9; i++) {
    r.l[i] = wl[i];
    r.h[i] = wh[i];
  }
  r.sh = ((u32)(u64)b & 3) * 8;
  r.sub = sub;
  r.sc = *(const u16*)(b + 192 + hf * 8 + 2 * g);
  r.d = *(const u16*)(b + 208);
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q6_K>(const Raw<T_Q6_K>& r, W32& w) {
  int g = r.sub & 3;
  int lsh = (g >> 1) * 4, hsh = 2 * g;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    int l = (int)__funnelshift_r(r.l[i], r.l[i + 1], r.sh), h = (int)__funnelshift_r(r.h[i], r.h[i + 1], r.sh);
    w.q[i] = sub32(((l >> lsh) & 0x0F0F0F0F) | (((h >> hsh) & 0x03030303) << 4));
  }
  w.a = h2f(r.d);
  w.s0 = (int)(i8)(r.sc & 0xff);
  w.s1 = (int)(i8)(r.sc >> 8);
  return true;
}
RAW_UNPACK32(T_Q6_K)
template <>
__device__ __forceinline__ float finish<T_Q6_K>(const W32& w, int lo, int hi, float d8, float s8) {
  return w.a * d8 * (float)(w.s0 * lo + w.s1 * hi);
}

// The repacked layouts (cuda/repack.rs). A chunk's 32 values, 4 bits each, in 16 bytes: word i
// holds values 4i..4i+3 in its low nibbles and 16+4i..16+4i+3 in its high ones (one 16-byte load
// per lane, a warp's lanes reading consecutive chunks: 512 contiguous bytes, where the GGUF order
// spreads a chunk over 32 bytes shared with its neighbour).
// A GPU layout's chunk is finished as its GGUF type's (the same bits).
#define FINISH_AS(TR, T)                                                                           \
  template <>                                                                                      \
  __device__ __forceinline__ float finish<TR>(const W32& w, int lo, int hi, float d8, float s8) {  \
    return finish<T>(w, lo, hi, d8, s8);                                                           \
  }
// Q4_KR: superblocks of 144 bytes, the GGUF header (d, dmin, scales[12]) then chunks 0..7.
// Q6_KR: a row of n chunks in four parts, each 16-byte aligned (the GGUF's 210-byte superblocks
// are only 2-byte aligned, so its chunk took 18 four-byte loads): low nibbles (16 bytes a chunk),
// high bits (8 bytes a chunk: word j's byte k holds, in bits 2m..2m+1, value 4(4j+m)+k's), the
// chunk's two int8 scales, and each superblock's f16 d.
template <>
struct Raw<T_Q4_KR> {
  int4 h, x;
  int sub;
};
template <>
__device__ __forceinline__ void raw_load<T_Q4_KR>(Raw<T_Q4_KR>& r, const u8* row, int c, int n) {
  const u8* b = row + (c >> 3) * 144;
  r.sub = c & 7;
  r.h = ldw4(b);
  r.x = ldw4(b + 16 + 16 * r.sub);
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q4_KR>(const Raw<T_Q4_KR>& r, W32& w) {
  int x[4] = {r.x.x, r.x.y, r.x.z, r.x.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    w.q[i] = x[i] & 0x0F0F0F0F;
    w.q[4 + i] = (x[i] >> 4) & 0x0F0F0F0F;
  }
  q4k_header(r.h, r.sub, w);
  return true;
}
RAW_UNPACK32(T_Q4_KR)
FINISH_AS(T_Q4_KR, T_Q4_K)
template <>
struct Raw<T_Q6_KR> {
  uint4 l;
  uint2 h;
  u16 sc, d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q6_KR>(Raw<T_Q6_KR>& r, const u8* row, int c, int n) {
  int4 l = ldw4(row + 16 * c);
  r.l = make_uint4((u32)l.x, (u32)l.y, (u32)l.z, (u32)l.w);
  r.h = ldw2(row + 16 * n + 8 * c);
  r.sc = ldwh(row + 24 * n + 2 * c);
  r.d = ldwh(row + 26 * n + 2 * (c >> 3));
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q6_KR>(const Raw<T_Q6_KR>& r, W32& w) {
  u32 l[4] = {r.l.x, r.l.y, r.l.z, r.l.w}, h[2] = {r.h.x, r.h.y};
#pragma unroll
  for (int i = 0; i < 8; i++)
    w.q[i] = sub32((int)(((l[i & 3] >> (4 * (i >> 2))) & 0x0F0F0F0Fu) | (((h[i >> 2] >> (2 * (i & 3))) & 0x03030303u) << 4)));
  w.a = h2f(r.d);
  w.s0 = (int)(i8)(r.sc & 0xff);
  w.s1 = (int)(i8)(r.sc >> 8);
  return true;
}
RAW_UNPACK32(T_Q6_KR)
FINISH_AS(T_Q6_KR, T_Q6_K)
// Q5_0R: a row of n chunks as low nibbles (16 bytes a chunk, the GGUF block's), the blocks' 32
// high bits (4 bytes a chunk), their f16 scales (2 bytes a chunk). Q8_0R: quants (32 bytes a
// chunk), then the f16 scales. Three loads a chunk where the GGUF blocks took 11 and 17 two-byte ones.
template <>
struct Raw<T_Q5_0R> {
  int4 x;
  u32 qh;
  u16 d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q5_0R>(Raw<T_Q5_0R>& r, const u8* row, int c, int n) {
  r.x = ldw4(row + 16 * c);
  r.qh = ldw1(row + 16 * n + 4 * c);
  r.d = ldwh(row + 20 * n + 2 * c);
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q5_0R>(const Raw<T_Q5_0R>& r, W32& w) {
  int x[4] = {r.x.x, r.x.y, r.x.z, r.x.w};
  unpack_q5_0(x, r.qh, r.d, w);
  return true;
}
RAW_UNPACK32(T_Q5_0R)
FINISH_AS(T_Q5_0R, T_Q5_0)
template <>
struct Raw<T_Q8_0R> {
  int4 a, b;
  u16 d;
};
template <>
__device__ __forceinline__ void raw_load<T_Q8_0R>(Raw<T_Q8_0R>& r, const u8* row, int c, int n) {
  r.a = ldw4(row + 32 * c);
  r.b = ldw4(row + 32 * c + 16);
  r.d = ldwh(row + 32 * n + 2 * c);
}
template <>
__device__ __forceinline__ bool raw_unpack<T_Q8_0R>(const Raw<T_Q8_0R>& r, W32& w) {
  w.q[0] = r.a.x; w.q[1] = r.a.y; w.q[2] = r.a.z; w.q[3] = r.a.w;
  w.q[4] = r.b.x; w.q[5] = r.b.y; w.q[6] = r.b.z; w.q[7] = r.b.w;
  w.a = h2f(r.d);
  return true;
}
RAW_UNPACK32(T_Q8_0R)
FINISH_AS(T_Q8_0R, T_Q8_0)
// dot32 of a repacked chunk: its finish() of the two halves (the bits of the GGUF type's dot32).
#define DOT32_UNPACKED(T)                                                                              \
  template <>                                                                                         \
  __device__ __forceinline__ float dot32<T>(const u8* row, int c, const int* a, float d8, float s8, int n) { \
    W32 w;                                                                                            \
    unpack32<T>(row, c, w, n);                                                                        \
    int lo = dp4a(w.q[3], a[3], dp4a(w.q[2], a[2], dp4a(w.q[1], a[1], dp4a(w.q[0], a[0], 0))));      \
    int hi = dp4a(w.q[7], a[7], dp4a(w.q[6], a[6], dp4a(w.q[5], a[5], dp4a(w.q[4], a[4], 0))));      \
    return finish<T>(w, lo, hi, d8, s8);                                                               \
  }
DOT32_UNPACKED(T_Q4_KR)
DOT32_UNPACKED(T_Q6_KR)
DOT32_UNPACKED(T_Q5_0R)
DOT32_UNPACKED(T_Q8_0R)

// Q8_0R loads its chunk in place (dot32): a chunk ahead took the decode matvec from 64 to 76
// registers (two waves for the 7B's down), and its matrices of 896 columns have one chunk a lane.
__device__ __forceinline__ constexpr bool int_form(int t) {
  return t == T_Q4_K || t == T_Q6_K || t == T_Q5_0 || t == T_Q8_0 || t == T_Q4_0 || t == T_Q4_1 ||
         t == T_Q5_1 || t == T_Q5_K || t == T_Q4_KR || t == T_Q6_KR || t == T_Q5_0R;
}
// The two 16-value halves of a chunk's dot with activations a0 (values 0-15) and a1 (16-31).
__device__ __forceinline__ int dot16(const int* q, int4 a) {
  return dp4a(q[3], a.w, dp4a(q[2], a.z, dp4a(q[1], a.y, dp4a(q[0], a.x, 0))));
}

// Dot of one row with the whole q8 activation vector, by one warp. With `step` 64 (matvec2) the
// warp takes the chunks 64 i + off + lane and returns its lanes' sums unreduced.
// wait: pdl_wait() after the first weight load (PDL_EARLY), not before the call.
template <int T>
__device__ float row_dot_t(const u8* __restrict__ row, int nchunks, const i8* __restrict__ aq,
                           const float2* __restrict__ ad, int off = 0, int step = 32, bool wait = false) {
  float acc = 0.f;
  int lane = threadIdx.x & 31;
#ifndef NO_PF
  if (int_form(T)) {  // the weights loaded a chunk ahead; finish() gives dot32's bits
    Raw<T> r;
    if (lane + off < nchunks) raw_load<T>(r, row, lane + off, nchunks);
    if (wait) pdl_wait();
    for (int c = lane + off; c < nchunks; c += step) {
      W32 w;
      raw_unpack<T>(r, w);
      if (c + step < nchunks) raw_load<T>(r, row, c + step, nchunks);
      const int4* ap = (const int4*)(aq + c * 32);
      int4 a0 = ap[0], a1 = ap[1];
      float2 ds = ad[c];
      acc += finish<T>(w, dot16(w.q, a0), dot16(w.q + 4, a1), ds.x, ds.y);
    }
    pdl_trigger();
    return step == 32 ? warp_sum(acc) : acc;
  }
#endif
  if (wait) pdl_wait();
#pragma unroll 4
  for (int c = lane + off; c < nchunks; c += step) {
    int a[8];
    const int4* ap = (const int4*)(aq + c * 32);
    int4 a0 = ap[0], a1 = ap[1];
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    float2 ds = ad[c];
    acc += dot32<T>(row, c, a, ds.x, ds.y, nchunks);
  }
  pdl_trigger();
  return step == 32 ? warp_sum(acc) : acc;
}
// R: also the Q5_0R and Q8_0R layouts (the `_r` kernels, for models that have them). Two cases more
// in the switch cost the 1.5B and the 7B 2-3% of their decode (H200, session 35), so their
// kernels are built without them.
template <bool R>
__device__ float row_dot(int type, const u8* row, int nchunks, const i8* aq, const float2* ad, int off = 0,
                         int step = 32, bool wait = false) {
  if (R && type == T_Q5_0R) return row_dot_t<T_Q5_0R>(row, nchunks, aq, ad, off, step, wait);
  if (R && type == T_Q8_0R) return row_dot_t<T_Q8_0R>(row, nchunks, aq, ad, off, step, wait);
  switch (type) {
    case T_Q4_K: return row_dot_t<T_Q4_K>(row, nchunks, aq, ad, off, step, wait);
    case T_Q6_K: return row_dot_t<T_Q6_K>(row, nchunks, aq, ad, off, step, wait);
    case T_Q4_KR: return row_dot_t<T_Q4_KR>(row, nchunks, aq, ad, off, step, wait);
    case T_Q6_KR: return row_dot_t<T_Q6_KR>(row, nchunks, aq, ad, off, step, wait);
    case T_Q5_0: return row_dot_t<T_Q5_0>(row, nchunks, aq, ad, off, step, wait);
    case T_Q8_0: return row_dot_t<T_Q8_0>(row, nchunks, aq, ad, off, step, wait);
    case T_Q4_0: return row_dot_t<T_Q4_0>(row, nchunks, aq, ad, off, step, wait);
    case T_Q4_1: return row_dot_t<T_Q4_1>(row, nchunks, aq, ad, off, step, wait);
    case T_Q5_1: return row_dot_t<T_Q5_1>(row, nchunks, aq, ad, off, step, wait);
    case T_Q5_K: return row_dot_t<T_Q5_K>(row, nchunks, aq, ad, off, step, wait);
    case T_F16: return row_dot_t<T_F16>(row, nchunks, aq, ad, off, step, wait);
    case T_BF16: return row_dot_t<T_BF16>(row, nchunks, aq, ad, off, step, wait);
    default: return row_dot_t<T_F32>(row, nchunks, aq, ad, off, step, wait);
  }
}

struct Seg {
  const u8* w;
  u64 row_bytes;
  int type;
  int rows;
};

// out[r] (+)= W[r] . a (+ bias[r]) for the rows of up to three matrices stacked (Q, K, V).
// One warp per row, 4 warps per block. mode 0 stores, 1 adds (the residual).
#ifndef MENS_BATCH_MODULE
template <bool R>
__device__ __forceinline__ void matvec_t(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, float* out,
                                         const float* bias, int mode) {
  int r = blockIdx.x * 4 + (threadIdx.x >> 5);
  int total = s0.rows + s1.rows + s2.rows;
  Seg s = s0;
  int rr = r;
  if (rr >= s0.rows) {
    rr -= s0.rows;
    s = s1;
    if (rr >= s1.rows) {
      rr -= s1.rows;
      s = s2;
    }
  }
  if (!PDL_EARLY || r >= total) pdl_wait();
  if (r >= total) return;
  float v = row_dot<R>(s.type, s.w + (u64)rr * s.row_bytes, cols / 32, aq, ad, 0, 32, PDL_EARLY);
  if ((threadIdx.x & 31) == 0) {
    if (bias) v += bias[r];
    out[r] = mode ? out[r] + v : v;
  }
}
extern "C" __global__ void matvec(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, float* out,
                                  const float* bias, int mode) {
  matvec_t<false>(s0, s1, s2, cols, aq, ad, out, bias, mode);
}
extern "C" __global__ void matvec_r(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad, float* out,
                                    const float* bias, int mode) {
  matvec_t<true>(s0, s1, s2, cols, aq, ad, out, bias, mode);
}
#endif

// matvec's contract for one matrix with two warps a row (2 rows a block of 4 warps): 64 streams,
// chunk c in stream c % 64, warp h the streams 32 h .. 32 h + 31 (512 contiguous bytes a pass),
// summed as streams l and l + 32, then warp_sum's tree: each warp's chain of dependent passes is
// half as long (the 1.5B's ffn_down: 4-5 passes a lane instead of 8-9). Other bits than matvec's.
#ifndef MENS_BATCH_MODULE
template <bool R>
__device__ __forceinline__ void matvec2_t(Seg s, int cols, const i8* aq, const float2* ad, float* out, int mode) {
  __shared__ float part[2][32];
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = w & 1, j = w >> 1;
  int r = blockIdx.x * 2 + j;
  float v = 0.f;
  if (!PDL_EARLY) pdl_wait();
  if (r < s.rows) v = row_dot<R>(s.type, s.w + (u64)r * s.row_bytes, cols / 32, aq, ad, 32 * h, 64, PDL_EARLY);
  if (PDL_EARLY) pdl_wait();
  if (h) part[j][lane] = v;
  __syncthreads();
  if (h || r >= s.rows) return;
  v = warp_sum(v + part[j][lane]);
  if (lane == 0) out[r] = mode ? out[r] + v : v;
}
extern "C" __global__ void matvec2(Seg s, int cols, const i8* aq, const float2* ad, float* out, int mode) {
  matvec2_t<false>(s, cols, aq, ad, out, mode);
}
extern "C" __global__ void matvec2_r(Seg s, int cols, const i8* aq, const float2* ad, float* out, int mode) {
  matvec2_t<true>(s, cols, aq, ad, out, mode);
}
#endif

// Quantize 32 floats held one per lane into a q8 block (by one warp).
__device__ __forceinline__ void quant_lane(float v, i8* qs, float2* ds) {
  float amax = warp_max(fabsf(v));
  float d = amax / 127.f;
  int q = d > 0.f ? __float2int_rn(v / d) : 0;
  qs[threadIdx.x & 31] = (i8)q;
  float sq = warp_sum((float)q);
  if ((threadIdx.x & 31) == 0) *ds = make_float2(d, d * sq);
}
// A deferred norm's group by one warp (lane l: x and its norm weight w): q8 of x · w into qs, ds;
// returns the group's sum of squares of x. No FMAs: decode and the batch make the same bits.
__device__ __forceinline__ float group_q8(float x, float w, i8* qs, float2* ds) {
  quant_lane(__fmul_rn(x, w), qs, ds);
  return warp_sum(__fmul_rn(x, x));
}

// Decode kernels that normalise their own input (`nx` non-null: the residual x, its RMSNorm
// weight `ng` and eps) instead of reading rmsnorm_q8's output: one kernel fewer between the layers'
// matvecs (two a layer). Each block makes the whole q8 vector in shared memory, with
// rmsnorm_q8's bits: the sum of squares in the order of its 1024 threads (each warp here stands
// for 32 / warps of them, each with its own butterfly), then each chunk quantized as quant_lane
// does (by 8 threads here: a chunk's max and its integer sum do not depend on the order). x and
// the weight are copied in first, all of a block's loads in flight together (the weight before
// pdl_wait(): no kernel writes it). Dims up to NORM_MAXD, multiples of 128.
#define NORM_MAXD 4096
struct NormQ8 {
  float4 x[NORM_MAXD / 4], w[NORM_MAXD / 4];
  int q[NORM_MAXD / 4];  // int8 values, 16-byte aligned for the chunk loads
  float2 d[NORM_MAXD / 32];
  float red[32];
};
// 16 bytes global -> shared without a register (sm_80+; a plain copy before).
__device__ __forceinline__ void copy16(float4* dst, const float4* src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
#else
  *dst = *src;
#endif
}
__device__ __forceinline__ void copy_in(float4* dst, const float* src, int dim) {
  for (int t = threadIdx.x; t < dim / 4; t += blockDim.x) copy16(dst + t, (const float4*)src + t);
}
// Before pdl_wait(): the norm weight's copy.
__device__ __forceinline__ void norm_q8_start(const float* ng, int dim, NormQ8& s) { copy_in(s.w, ng, dim); }
// After pdl_wait(): x's copy, then the vector; ends with __syncthreads().
__device__ __forceinline__ void norm_q8_block(const float* x, float eps, int dim, NormQ8& s) {
  copy_in(s.x, x, dim);
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
  __syncthreads();
  const float* xs = (const float*)s.x;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int base = 0; base < 32; base += 8 * nw) {
    float ss[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      int vw = base + w + k * nw;
      ss[k] = 0.f;
#pragma unroll
      for (int j = 0; j < NORM_MAXD / 1024; j++) {
        int i = vw * 32 + lane + 1024 * j;
        if (vw < 32 && i < dim) ss[k] += xs[i] * xs[i];
      }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) ss[k] = warp_sum(ss[k]);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      int vw = base + w + k * nw;
      if (lane == 0 && vw < 32) s.red[vw] = ss[k];
    }
  }
  __syncthreads();
  float scale = rsqrtf(warp_sum(s.red[lane]) / dim + eps);
  // Chunk b's values 4 g .. 4 g + 3 by thread 8 b + g.
  for (int t = threadIdx.x; t < dim / 4; t += blockDim.x) {
    float4 a = s.x[t], c = s.w[t];
    float v[4] = {a.x * scale * c.x, a.y * scale * c.y, a.z * scale * c.z, a.w * scale * c.w};
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    float d = amax / 127.f;
    int sum = 0;
    u32 packed = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      int q = d > 0.f ? __float2int_rn(v[k] / d) : 0;
      sum += q;
      packed |= (u32)(u8)(i8)q << (8 * k);
    }
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    s.q[t] = (int)packed;
    if ((t & 7) == 0) s.d[t >> 3] = make_float2(d, d * (float)sum);
  }
  __syncthreads();
}

// A decode kernel's start: pdl_wait(), and with nx its input made from x (aq, ad then point into
// shared memory).
__device__ __forceinline__ void norm_input(const float* nx, const float* ng, float eps, int dim, NormQ8& s,
                                           const i8*& aq, const float2*& ad) {
  if (nx) norm_q8_start(ng, dim, s);
  pdl_wait();
  if (nx) {
    norm_q8_block(nx, eps, dim, s);
    aq = (const i8*)s.q;
    ad = s.d;
  }
}

// Chunk c (loaded in ca, cb) into x, y; chunk `next` (if below n) loaded into ca, cb meanwhile.
template <int T>
__device__ __forceinline__ void dot2_step(Raw<T>& ca, Raw<T>& cb, const u8* ra, const u8* rb, int c, int next,
                                          int n, const i8* __restrict__ aq, const float2* __restrict__ ad,
                                          float& x, float& y) {
  W32 wa, wb;
  raw_unpack<T>(ca, wa);
  raw_unpack<T>(cb, wb);
  if (next < n) {
    raw_load<T>(ca, ra, next, n);
    raw_load<T>(cb, rb, next, n);
  }
  const int4* ap = (const int4*)(aq + c * 32);
  int4 a0 = ap[0], a1 = ap[1];
  float2 ds = ad[c];
  x += finish<T>(wa, dot16(wa.q, a0), dot16(wa.q + 4, a1), ds.x, ds.y);
  y += finish<T>(wb, dot16(wb.q, a0), dot16(wb.q + 4, a1), ds.x, ds.y);
}
// Two rows of one type against the same activations, loads interleaved (gate and up).
// pf: lines to prefetch into L1 after the wait (a deferred norm's sums, read at the kernel's end).
template <int T>
__device__ float2 row_dot2_t(const u8* __restrict__ ra, const u8* __restrict__ rb, int nchunks,
                             const i8* __restrict__ aq, const float2* __restrict__ ad, bool wait = false,
                             const float* pf = nullptr) {
  float x = 0.f, y = 0.f;
  int lane = threadIdx.x & 31;
#ifndef NO_PF
  if (int_form(T)) {
    Raw<T> ca, cb;
    if (lane < nchunks) {
      raw_load<T>(ca, ra, lane, nchunks);
      raw_load<T>(cb, rb, lane, nchunks);
    }
    if (wait) pdl_wait();
    prefetch_l1(pf, nchunks);
    for (int c = lane; c < nchunks; c += 32) dot2_step<T>(ca, cb, ra, rb, c, c + 32, nchunks, aq, ad, x, y);
    pdl_trigger();
    return make_float2(warp_sum(x), warp_sum(y));
  }
#endif
  if (wait) pdl_wait();
  prefetch_l1(pf, nchunks);
#pragma unroll 2
  for (int c = lane; c < nchunks; c += 32) {
    int a[8];
    const int4* ap = (const int4*)(aq + c * 32);
    int4 a0 = ap[0], a1 = ap[1];
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    float2 ds = ad[c];
    x += dot32<T>(ra, c, a, ds.x, ds.y, nchunks);
    y += dot32<T>(rb, c, a, ds.x, ds.y, nchunks);
  }
  pdl_trigger();
  return make_float2(warp_sum(x), warp_sum(y));
}
// row_dot2_t's sums, the same bits, with each half-warp on its own pair of rows: lane h of a half
// takes chunks h, h + 16, h + 32, ... into two sums, chunks h + 32 i (the stream of row_dot2_t's
// lane h) and h + 16 + 32 i (lane h + 16's), adds them as warp_sum's first step adds those two
// lanes, then the rest of warp_sum's tree within the half. Two row pairs then take ceil(n / 16)
// passes where a warp takes 2 ceil(n / 32) for them (112 chunks: 7 against 8; 48: 3 against 4).
// Int forms only (Raw loads).
template <int T>
__device__ float2 row_dot2_half_t(const u8* __restrict__ ra, const u8* __restrict__ rb, int nchunks,
                                  const i8* __restrict__ aq, const float2* __restrict__ ad, bool wait = false,
                                  const float* pf = nullptr) {
  float x0 = 0.f, y0 = 0.f, x1 = 0.f, y1 = 0.f;
  int h = threadIdx.x & 15;
  Raw<T> ca, cb;
  if (h < nchunks) {
    raw_load<T>(ca, ra, h, nchunks);
    raw_load<T>(cb, rb, h, nchunks);
  }
  if (wait) pdl_wait();
  prefetch_l1(pf, nchunks);
  for (int c = h; c < nchunks; c += 32) {
    dot2_step<T>(ca, cb, ra, rb, c, c + 16, nchunks, aq, ad, x0, y0);
    if (c + 16 < nchunks) dot2_step<T>(ca, cb, ra, rb, c + 16, c + 32, nchunks, aq, ad, x1, y1);
  }
  pdl_trigger();
  float x = x0 + x1, y = y0 + y1;
  for (int o = 8; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffff, x, o);
    y += __shfl_xor_sync(0xffffffff, y, o);
  }
  return make_float2(x, y);
}
__device__ __forceinline__ constexpr bool half_form(int t) {
  return t == T_Q4_KR || t == T_Q6_KR || t == T_Q4_K || t == T_Q6_K;
}

template <bool R>
__device__ float2 row_dot2(int ta, const u8* ra, int tb, const u8* rb, int nchunks, const i8* aq, const float2* ad,
                         bool wait = false, const float* pf = nullptr) {
  if (ta == tb) {
    if (R && ta == T_Q5_0R) return row_dot2_t<T_Q5_0R>(ra, rb, nchunks, aq, ad, wait, pf);
    if (R && ta == T_Q8_0R) return row_dot2_t<T_Q8_0R>(ra, rb, nchunks, aq, ad, wait, pf);
    switch (ta) {
      case T_Q4_K: return row_dot2_t<T_Q4_K>(ra, rb, nchunks, aq, ad, wait, pf);
      case T_Q6_K: return row_dot2_t<T_Q6_K>(ra, rb, nchunks, aq, ad, wait, pf);
      case T_Q4_KR: return row_dot2_t<T_Q4_KR>(ra, rb, nchunks, aq, ad, wait, pf);
      case T_Q6_KR: return row_dot2_t<T_Q6_KR>(ra, rb, nchunks, aq, ad, wait, pf);
      case T_Q5_0: return row_dot2_t<T_Q5_0>(ra, rb, nchunks, aq, ad, wait, pf);
      case T_Q8_0: return row_dot2_t<T_Q8_0>(ra, rb, nchunks, aq, ad, wait, pf);
      default: break;
    }
  }
  return make_float2(row_dot<R>(ta, ra, nchunks, aq, ad, 0, 32, wait), row_dot<R>(tb, rb, nchunks, aq, ad));
}

// out[r] = W[r] . a, two rows a warp (row_dot2: each row's bits as matvec's, with both rows'
// loads in flight in each lane), 8 rows a block; the _add kernels add to out (the O projection's
// residual). The LM head alone on the H200: 1.5B 89.6 -> 76.2 us, 7B 142.9 -> 133.1
// (docs/benchmarks.md, session 38). PAIR_MINB: the blocks an SM its launch bounds ask for, 6 (80
// registers; 0: none, 96 registers and 5 blocks, 1.5B decode 1.3% slower).
#ifndef PAIR_MINB
#define PAIR_MINB 6
#endif
#if PAIR_MINB > 0
#define PAIR_LB __launch_bounds__(128, PAIR_MINB)
#else
#define PAIR_LB
#endif
#ifndef MENS_BATCH_MODULE
template <bool R, bool ADD>
__device__ __forceinline__ void matvec_pair_t(Seg s, int cols, const i8* aq, const float2* ad, float* out) {
  int ra = 2 * (blockIdx.x * 4 + (threadIdx.x >> 5)), rb = min(ra + 1, s.rows - 1);
  if (!PDL_EARLY || ra >= s.rows) pdl_wait();
  if (ra >= s.rows) return;
  float2 v = row_dot2<R>(s.type, s.w + (u64)ra * s.row_bytes, s.type, s.w + (u64)rb * s.row_bytes, cols / 32, aq,
                         ad, PDL_EARLY);
  if ((threadIdx.x & 31) == 0) {
    out[ra] = ADD ? out[ra] + v.x : v.x;
    if (rb > ra) out[rb] = ADD ? out[rb] + v.y : v.y;
  }
}
// The same, four rows a warp (a pair a half-warp: row_dot2_half_t), 16 rows a block; a kernel
// per type (the GPU layouts). The LM head: 7B 134 -> 116 us on the H200 (session 39).
template <int T>
__device__ __forceinline__ void matvec_pair_h_t(Seg s, int cols, const i8* aq, const float2* ad, float* out) {
  int lane = threadIdx.x & 31;
  int first = 4 * (blockIdx.x * 4 + (threadIdx.x >> 5)), ra = first + 2 * (lane >> 4);
  if (!PDL_EARLY || first >= s.rows) pdl_wait();
  if (first >= s.rows) return;
  int a = min(ra, s.rows - 1), b = min(ra + 1, s.rows - 1);
  float2 v = row_dot2_half_t<T>(s.w + (u64)a * s.row_bytes, s.w + (u64)b * s.row_bytes, cols / 32, aq, ad,
                                PDL_EARLY);
  if ((lane & 15) == 0) {
    if (ra < s.rows) out[ra] = v.x;
    if (ra + 1 < s.rows) out[ra + 1] = v.y;
  }
}
#define MATVEC_PAIR_H(NAME, T)                                                                           \
  extern "C" __global__ void PAIR_LB NAME(Seg s, int cols, const i8* aq, const float2* ad, float* out) {  \
    matvec_pair_h_t<T>(s, cols, aq, ad, out);                                                            \
  }
MATVEC_PAIR_H(matvec_pair_h_q4kr, T_Q4_KR)
MATVEC_PAIR_H(matvec_pair_h_q6kr, T_Q6_KR)
#define MATVEC_PAIR(NAME, R, ADD)                                                                          \
  extern "C" __global__ void PAIR_LB NAME(Seg s, int cols, const i8* aq, const float2* ad, float* out) {      \
    matvec_pair_t<R, ADD>(s, cols, aq, ad, out);                                                           \
  }
MATVEC_PAIR(matvec_pair, false, false)
MATVEC_PAIR(matvec_pair_r, true, false)
MATVEC_PAIR(matvec_pair_add, false, true)
MATVEC_PAIR(matvec_pair_add_r, true, true)

// The residual matvecs before a deferred norm (O, down): out[r] += W[r] . a as matvec (a row a
// warp, 4 rows a block) or matvec_pair_add (a row pair a warp, 8 rows a block), then each q8 group
// of the next norm's input from a cluster of blocks that together make its 32 rows (8 or 4): every
// block stores its rows' new x in rank 0's shared memory, and after the cluster's barrier rank 0's
// first warp makes the group as rmsnorm_q8d does (q8 of x . w in nq, nd; the sum of squares in np).
// Dims a multiple of 32 (every row of every block exists: all threads reach the barrier).
__device__ __forceinline__ void st_rank0(float* p, float v) {
  u32 a = (u32)__cvta_generic_to_shared(p), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(r) : "r"(a));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// One warp: group g of the norm input from its 32 values of x (lane l: x[32 g + l], w its weight),
// with its sum of squares in every copy (group_q8: the batch's rmsnorm_q8s too).
__device__ __forceinline__ void norm_group(float x, float w, int g, i8* nq, float2* nd, float* np) {
  float p = group_q8(x, w, nq + g * 32, nd + g);
  int l = threadIdx.x & 31;
  if (l < NP_REPS) np[l * NP_MAX + g] = p;  // a copy a lane
}
template <bool R, bool PAIR>
__device__ __forceinline__ void matvec_add_nq_t(Seg s, int cols, const i8* aq, const float2* ad, float* out,
                                                const float* nw, i8* nq, float2* nd, float* np) {
  __shared__ float xs[32];
  __shared__ __align__(16) float ws[32];
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r = PAIR ? 2 * (blockIdx.x * 4 + w) : blockIdx.x * 4 + w;
  // The group's norm weights into shared memory before the wait (never written; no registers held).
  if (cluster_rank() == 0 && w == 0 && lane < 8) copy16((float4*)ws + lane, (const float4*)(nw + (r >> 5) * 32) + lane);
  if (!PDL_EARLY) pdl_wait();
  if (PAIR) {
    float2 v = row_dot2<R>(s.type, s.w + (u64)r * s.row_bytes, s.type, s.w + (u64)(r + 1) * s.row_bytes, cols / 32,
                           aq, ad, PDL_EARLY);
    if (lane == 0) {
      float x0 = out[r] + v.x, x1 = out[r + 1] + v.y;
      out[r] = x0;
      out[r + 1] = x1;
      st_rank0(&xs[r & 31], x0);
      st_rank0(&xs[(r + 1) & 31], x1);
    }
  } else {
    float v = row_dot<R>(s.type, s.w + (u64)r * s.row_bytes, cols / 32, aq, ad, 0, 32, PDL_EARLY);
    if (lane == 0) {
      float x = out[r] + v;
      out[r] = x;
      st_rank0(&xs[r & 31], x);
    }
  }
  cluster_sync();
  if (cluster_rank() == 0 && w == 0) {
    int g = r >> 5;
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    __syncwarp();
    norm_group(xs[lane], ws[lane], g, nq, nd, np);
  }
}
#define MATVEC_ADD_NQ(NAME, R, PAIR, CL, LB)                                                              \
  extern "C" __global__ void __cluster_dims__(CL, 1, 1) LB                                              \
      NAME(Seg s, int cols, const i8* aq, const float2* ad, float* out, const float* nw, i8* nq, float2* nd, \
           float* np) {                                                                                  \
    matvec_add_nq_t<R, PAIR>(s, cols, aq, ad, out, nw, nq, nd, np);                                      \
  }
MATVEC_ADD_NQ(matvec_add_nq, false, false, 8, )
MATVEC_ADD_NQ(matvec_add_nq_r, true, false, 8, )
MATVEC_ADD_NQ(matvec_pair_add_nq, false, true, 4, )  // 96 registers: its 8-row blocks of the 7B's
MATVEC_ADD_NQ(matvec_pair_add_nq_r, true, true, 4, )  // O are 3.4 an SM (PAIR_LB's 80 spilled)
#endif

// h = silu(gate . a) * (up . a), quantized to q8: a block makes 32 rows (one q8 block), a gate
// row and an up row at a time per warp (blocks of 32 warps: one pair each; of 8: four pairs,
// and several blocks share an SM). T: the type of both matrices (one kernel per common type, so
// that each gets its own registers: the kernel for any types spills), or -1.
template <int T, bool HALF = false>
__device__ __forceinline__ void glu_q8(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, i8* hq,
                                       float2* hd, const float* nx, const float* ng, float eps, const float* np) {
  __shared__ __align__(16) NormQ8 ns;
  // PDL_EARLY: without a norm to make, the first row pair's first loads before pdl_wait() (with
  // one, loads issued before it took registers and were slower on the 0.5B: session 37).
  bool early = PDL_EARLY && !nx;
  if (!early) norm_input(nx, ng, eps, cols, ns, aq, ad);
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  // Gate and up sums by row; h from them at the end (np: with the deferred norm's scale, which
  // the first row's prefetch brought into L1).
  __shared__ float2 g_u[32];
  if (HALF && half_form(T)) {  // two row pairs a warp at a time, a half-warp each (32 warps: one idles)
    for (int j0 = w; j0 < 32; j0 += 2 * nw) {
      int j = j0 + (lane >> 4) * nw, r = blockIdx.x * 32 + j;
      int rr = min(r, gate.rows - 1);
      float2 gu = row_dot2_half_t<half_form(T) ? T : T_Q4_K>(
          gate.w + (u64)rr * gate.row_bytes, up.w + (u64)rr * up.row_bytes, cols / 32, aq, ad, early && j0 == w,
          j0 == 0 ? np_copy(np) : nullptr);  // warp 0 reads them at the end
      if (r >= gate.rows) gu = make_float2(0.f, 0.f);
      if ((lane & 15) == 0 && j < 32) g_u[j] = gu;
    }
  } else
  for (int j = w; j < 32; j += nw) {
    int r = blockIdx.x * 32 + j;
    float2 gu = make_float2(0.f, 0.f);
    if (r < gate.rows) {
      const u8 *ra = gate.w + (u64)r * gate.row_bytes, *rb = up.w + (u64)r * up.row_bytes;
      bool wait = early && j == w;
      const float* pf = j == 0 ? np_copy(np) : nullptr;  // warp 0 reads them at the end
      gu = T < 0 ? row_dot2<true>(gate.type, ra, up.type, rb, cols / 32, aq, ad, wait, pf)
                 : row_dot2_t<T < 0 ? T_F32 : T>(ra, rb, cols / 32, aq, ad, wait, pf);
    }
    if (lane == 0) g_u[j] = gu;
  }
  if (early) pdl_wait();
  __syncthreads();
  if (w == 0) {
    float sc = np ? deferred_scale(np, cols / 32, eps) : 1.f;
    float2 gu = g_u[lane];
    float g = __fmul_rn(gu.x, sc), u = __fmul_rn(gu.y, sc);
    quant_lane(g / (1.f + expf(-g)) * u, hq + blockIdx.x * 32, hd + blockIdx.x);
  }
}
#define GLU_Q8_LBH(NAME, T, LB, HALF)                                                                     \
  extern "C" __global__ void LB                                                                           \
      NAME(Seg gate, Seg up, int cols, const i8* aq, const float2* ad, i8* hq, float2* hd, const float* nx,  \
           const float* ng, float eps, const float* np) {                                                  \
    glu_q8<T, HALF>(gate, up, cols, aq, ad, hq, hd, nx, ng, eps, np);                                      \
  }
#define GLU_Q8_LB(NAME, T, LB) GLU_Q8_LBH(NAME, T, LB, false)
#define GLU_Q8(NAME, T) GLU_Q8_LB(NAME, T, __launch_bounds__(1024))
// Registers for five blocks of 256 threads an SM (48; the kernel above takes 56, four blocks): a
// grid of more than four blocks an SM (the 7B's 592) then runs in one wave, not two (7B decode
// +5%; the 1.5B's 280 blocks lose 1% with it, so they keep the kernel above).
#ifndef MENS_BATCH_MODULE
GLU_Q8_LB(matvec_glu_q8_q4kr_5, T_Q4_KR, __launch_bounds__(256, 5))
GLU_Q8_LBH(matvec_glu_q8_q4kr_h, T_Q4_KR, __launch_bounds__(1024), true)
GLU_Q8(matvec_glu_q8, -1)
GLU_Q8(matvec_glu_q8_q4k, T_Q4_K)
GLU_Q8(matvec_glu_q8_q6k, T_Q6_K)
GLU_Q8(matvec_glu_q8_q4kr, T_Q4_KR)
GLU_Q8(matvec_glu_q8_q6kr, T_Q6_KR)
GLU_Q8(matvec_glu_q8_q5_0r, T_Q5_0R)
GLU_Q8(matvec_glu_q8_q8_0r, T_Q8_0R)
#endif

// Decode Q/K/V: the three matrices stacked, bias, RoPE, K and V into the f16 cache at *pos (with
// kc = 0, a quantized cache: K and V as f32 into their places in qkv, which the attention kernel
// stores), Q (rounded to f16, as llama.cpp's flash attention reads it) into qkv. One warp per pair
// of rows that RoPE rotates together (NeoX: i and i + hd/2; normal: 2i and 2i + 1); V rows are
// paired the same way, unrotated.
#ifndef MENS_BATCH_MODULE
template <bool R, bool HALF = false>
__device__ __forceinline__ void qkv_rope_t(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad,
                                           const float* bias, const float* cosv, const float* sinv, const int* pos,
                                           int n_head, int n_kv_head, int hd, int neox, float* qkv, u16* kc, u16* vc,
                                           const float* nx, const float* ng, float eps, const float* np) {
  __shared__ __align__(16) NormQ8 ns;
  int half = hd / 2;
  // HALF: two pairs a warp, a half-warp each (row_dot2_half_t; pairs 2 i and 2 i + 1 share a head,
  // so a segment and a type).
  int p = HALF ? 2 * (blockIdx.x * 4 + (threadIdx.x >> 5)) + ((threadIdx.x >> 4) & 1)
               : blockIdx.x * 4 + (threadIdx.x >> 5);
  int heads = n_head + 2 * n_kv_head;
  int h = p / half, k = p % half;
  int ra = h * hd + (neox ? k : 2 * k), rb = h * hd + (neox ? k + half : 2 * k + 1);
  Seg s = s0;
  int base = 0;
  if (ra >= s0.rows) {
    base = s0.rows;
    s = s1;
    if (ra >= s0.rows + s1.rows) {
      base = s0.rows + s1.rows;
      s = s2;
    }
  }
  bool early = PDL_EARLY && !nx;
  if (!early) norm_input(nx, ng, eps, cols, ns, aq, ad);
  if (HALF) {
    if ((p & ~1) >= heads * half) {  // the warp's first pair
      pdl_wait();
      return;
    }
  } else if (p >= heads * half) {
    pdl_wait();
    return;
  }
  float2 v;
  if (HALF) {
    const u8 *wa = s.w + (u64)(ra - base) * s.row_bytes, *wb = s.w + (u64)(rb - base) * s.row_bytes;
    v = s.type == T_Q6_KR ? row_dot2_half_t<T_Q6_KR>(wa, wb, cols / 32, aq, ad, early, np_copy(np))
                          : row_dot2_half_t<T_Q4_KR>(wa, wb, cols / 32, aq, ad, early, np_copy(np));
  } else {
    v = row_dot2<R>(s.type, s.w + (u64)(ra - base) * s.row_bytes, s.type, s.w + (u64)(rb - base) * s.row_bytes,
                    cols / 32, aq, ad, early, np_copy(np));
  }
  if (np) {  // the deferred norm's scale (its sums prefetched into L1 after the wait)
    float sc = deferred_scale(np, cols / 32, eps);
    v.x = __fmul_rn(v.x, sc);  // never fused with the bias's add: the batch's bits
    v.y = __fmul_rn(v.y, sc);
  }
  if (HALF && p >= heads * half) return;  // after the half-warp's shuffles
  if (early) pdl_wait();
  if ((threadIdx.x & (HALF ? 15 : 31)) != 0) return;
  float x0 = v.x, x1 = v.y;
  if (bias) {
    x0 += bias[ra];
    x1 += bias[rb];
  }
  int ps = *pos, kvd = n_kv_head * hd;
  if (h < n_head + n_kv_head) {
    float c = cosv[(u64)ps * half + k], sn = sinv[(u64)ps * half + k];
    float2 y = rope_rot(x0, x1, c, sn);
    float y0 = y.x, y1 = y.y;
    if (h < n_head) {
      qkv[ra] = h2f(f2h(y0));
      qkv[rb] = h2f(f2h(y1));
    } else if (!kc) {
      qkv[ra] = y0;
      qkv[rb] = y1;
    } else {
      int o = ps * kvd + (h - n_head) * hd;
      kc[o + ra - h * hd] = f2h(y0);
      kc[o + rb - h * hd] = f2h(y1);
    }
  } else if (!vc) {
    qkv[ra] = x0;
    qkv[rb] = x1;
  } else {
    int o = ps * kvd + (h - n_head - n_kv_head) * hd;
    vc[o + ra - h * hd] = f2h(x0);
    vc[o + rb - h * hd] = f2h(x1);
  }
}
#define QKV_ROPE(NAME, R) QKV_ROPE_H(NAME, R, false)
// Launch bounds for five blocks an SM (96 registers): without them the deferred norm's scale at the
// end took qkv_rope to 251.
#define QKV_ROPE_H(NAME, R, HALF)                                                                          \
  extern "C" __global__ void __launch_bounds__(128, 5) NAME(Seg s0, Seg s1, Seg s2, int cols, const i8* aq, const float2* ad,           \
                                  const float* bias, const float* cosv, const float* sinv, const int* pos,    \
                                  int n_head, int n_kv_head, int hd, int neox, float* qkv, u16* kc, u16* vc,  \
                                  const float* nx, const float* ng, float eps, const float* np) {             \
    qkv_rope_t<R, HALF>(s0, s1, s2, cols, aq, ad, bias, cosv, sinv, pos, n_head, n_kv_head, hd, neox, qkv, kc, \
                        vc, nx, ng, eps, np);                                                              \
  }
QKV_ROPE(qkv_rope, false)
QKV_ROPE(qkv_rope_r, true)
QKV_ROPE_H(qkv_rope_h, false, true)  // Q, K and V all Q4_KR or Q6_KR
#endif


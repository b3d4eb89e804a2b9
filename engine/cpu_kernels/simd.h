// What the engine's CPU kernels share: the vector instructions of this build (one code for AVX-512 and
// AVX2, chosen at compile time by -march), prefetching, and scalar helpers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace cpu_kernels {

constexpr int PREFETCH_BLOCKS = 2;  // how far ahead (in ~2 KB K-quant blocks) the kernels ask for weights

// Asks for `lines` cache lines from `from` on: the kernels ask for the weights a little ahead of the ones
// they multiply, spread over a block's loop, so that streaming them overlaps the dot products of the rows.
inline void prefetch_lines(const uint8_t* from, int lines) {
#if defined(__x86_64__) || defined(_M_X64)
  for (int i = 0; i < lines; ++i) _mm_prefetch(reinterpret_cast<const char*>(from) + i * 64, _MM_HINT_T0);
#else
  (void)from, (void)lines;
#endif
}

// Rounds v[0, n) to int8 at the scale that maps its largest magnitude to 127 (nearest, ties to even: the
// current rounding mode, as nearbyint), writes the sum of each `width` (16 or 32) of them to sums, returns the
// scale: the activations' rounding (llama.cpp's Q8_K per 256 values, Q8_0 per 32). The vector forms give the
// scalar one's values: a max is exact in any order, and each value is multiplied, then rounded, alone.
inline float round_to_int8(const float* v, int n, int width, int8_t* q, int32_t* sums) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  __m512 top = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
  const float amax = _mm512_reduce_max_ps(top);
  const __m512 inverse = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int h = 0; h < n / width; ++h) {
    int32_t total = 0;
    for (int i = h * width; i < (h + 1) * width; i += 16) {
      const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + i), inverse));
      const __m512i clamped = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(clamped));
      total += _mm512_reduce_add_epi32(clamped);
    }
    sums[h] = total;
  }
#elif defined(__AVX2__)
  __m256 top = _mm256_setzero_ps();
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int i = 0; i < n; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(v + i), magnitude));
  alignas(32) float tops[8];
  _mm256_store_ps(tops, top);
  const float amax = *std::max_element(tops, tops + 8);
  const __m256 inverse = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (int h = 0; h < n / width; ++h) {
    int32_t total = 0;
    for (int i = h * width; i < (h + 1) * width; i += 8) {
      const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), inverse));
      alignas(32) int32_t values[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(values), _mm256_min_epi32(_mm256_max_epi32(r, lo), hi));
      for (int j = 0; j < 8; ++j) {
        q[i + j] = static_cast<int8_t>(values[j]);
        total += values[j];
      }
    }
    sums[h] = total;
  }
#else
  float amax = 0.f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inverse = amax > 0.f ? 127.f / amax : 0.f;
  for (int h = 0; h < n / width; ++h) {
    int32_t total = 0;
    for (int i = h * width; i < (h + 1) * width; ++i) {
      const int value = std::max(-127, std::min(127, static_cast<int>(std::nearbyint(v[i] * inverse))));
      q[i] = static_cast<int8_t>(value);
      total += value;
    }
    sums[h] = total;
  }
#endif
  return amax / 127.f;
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline float half_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, subnormals included (the files' d and dmin are ordinary fp16).
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      float f = std::ldexp(static_cast<float>(mantissa), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// ---------------------------------------------------------------- SIMD: one code, two vector widths

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GGUF_MM_SIMD 1
struct Isa {
  static constexpr int L = 16;  // channels (int32 lanes) per vector: the whole tile
  using I = __m512i;
  using F = __m512;
  static constexpr bool kVnni = true;  // dot takes any unsigned byte (no 16-bit intermediate)
  static const char* name() { return "avx512-vnni"; }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I zero() { return _mm512_setzero_si512(); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I bytes(int8_t v) { return _mm512_set1_epi8(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  template <int S> static I shl16(I a) { return _mm512_slli_epi16(a, S); }
  template <int S> static I shr16(I a) { return _mm512_srli_epi16(a, S); }
  template <int S> static I shl32(I a) { return _mm512_slli_epi32(a, S); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I dot(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
  // int16 pairs times int16 pairs, each lane's two products added to it (exact: no saturation).
  static I dot16(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  // signed w times signed x: |w| times x with w's sign (the AVX2 form's counterpart; dot serves here).
  static I dot_signed(I acc, I w, I x) {
    const I x_signed = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(w), x_signed);
  }
  static I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static I u8_to_i32(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I s8_to_i32(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F half_to_f32(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F to_f32(I a) { return _mm512_cvtepi32_ps(a); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fmax(F a, F b) { return _mm512_max_ps(a, b); }
  static F fround(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F times_pow2(F p, F k) { return _mm512_scalef_ps(p, k); }  // p * 2^k, k integral
  static float fsum(F a) { return _mm512_reduce_add_ps(a); }
};
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define GGUF_MM_SIMD 1
struct Isa {
  static constexpr int L = 8;  // a tile is done in two halves of 8 channels
  using I = __m256i;
  using F = __m256;
  // signed w times signed x as |w| times x with w's sign (pairs of at most 127 * 127 * 2: no saturation).
  static I dot_signed(I acc, I w, I x) {
    const I products = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(products, _mm256_set1_epi16(1)));
  }
#if defined(__AVXVNNI__)
  static constexpr bool kVnni = true;
  static const char* name() { return "avx2-vnni"; }
  static I dot(I acc, I u8, I s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
#else
  static constexpr bool kVnni = false;  // dot's u8 operand must stay small (<= 128): see dot_signed
  static const char* name() { return "avx2"; }
  // u8 * s8 pairs summed to int16 (at most 63 * 127 * 2, no saturation), then pairs of those to int32.
  static I dot(I acc, I u8, I s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
  }
#endif
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I zero() { return _mm256_setzero_si256(); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I bytes(int8_t v) { return _mm256_set1_epi8(v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
  template <int S> static I shl16(I a) { return _mm256_slli_epi16(a, S); }
  template <int S> static I shr16(I a) { return _mm256_srli_epi16(a, S); }
  template <int S> static I shl32(I a) { return _mm256_slli_epi32(a, S); }
#if defined(__AVXVNNI__)
  static I dot16(I acc, I a, I b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#else
  static I dot16(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
#endif
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I u8_to_i32(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static I s8_to_i32(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static F half_to_f32(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F to_f32(I a) { return _mm256_cvtepi32_ps(a); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F fload(const float* p) { return _mm256_loadu_ps(p); }
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F fsub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fmax(F a, F b) { return _mm256_max_ps(a, b); }
  static F fround(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F times_pow2(F p, F k) {  // p * 2^k, k integral and >= -126 (2^k a normal float)
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
  static float fsum(F a) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, a);
    float total = 0.f;
    for (float lane : lanes) total += lane;
    return total;
  }
};
#endif

#ifdef GGUF_MM_SIMD
using I = Isa::I;
using F = Isa::F;
#endif

// Calls f(std::integral_constant<int, R>{}) with R = rows (1 .. 8; more count as 8): a kernel's row count
// as a compile-time constant, so that its accumulators stay in registers.
template <class Fn>
inline void with_rows(int rows, Fn&& f) {
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

inline const char* isa_name() {
#ifdef GGUF_MM_SIMD
  return Isa::name();
#else
  return "scalar";
#endif
}

}  // namespace cpu_kernels

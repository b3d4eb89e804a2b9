// Causal attention over the KV cache for a few query rows, each row computed alone in a fixed order.
//
// Why not torch's scaled_dot_product_attention: its CPU kernel blocks the work by the number of queries, so
// a query's output in a verify of 5 ids differs in the last bits from the same query decoded alone. With
// int8 activations after it (engine/cpu_kernels/gguf_mm.cpp) such a difference can flip a rounding and grow
// through the layers (0.56 on logits of magnitude 12, measured). Here every (head, query) pair runs the same
// loops whatever else is in the call, so a verify's rows equal plain decoding's bit for bit.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"

namespace {

using namespace cpu_kernels;

inline float dot(const float* a, const float* b, int n) {
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

// exp(x - shift) for x <= shift, as Cephes' expf: x - shift = n ln2 + r, |r| <= ln2 / 2, a degree-7
// polynomial for e^r, times 2^n. Relative error ~1e-7 (std::exp's order). One formula for every lane and for
// the scalar tail (explicit fused multiply-adds), so a score's weight depends on its value alone.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f, kLowest = -87.3f;

inline float exp_shifted(float x, float shift) {
  const float v = std::max(x - shift, kLowest);
  const float n = std::nearbyint(v * kLog2e);
  const float r = std::fma(n, -kLn2Lo, std::fma(n, -kLn2Hi, v));
  float p = std::fma(kP0, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  p = std::fma(p, r * r, r + 1.f);
  return std::ldexp(p, static_cast<int>(n));
}

// x[i] = exp(x[i] - shift) for i < n (exp_shifted's formula, a vector of them at a time, with the
// float operations of simd.h's Isa); returns their sum.
inline float exp_all(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float total = 0.f;
#ifdef GGUF_MM_SIMD
  const F s = Isa::fset1(shift), lowest = Isa::fset1(kLowest), log2e = Isa::fset1(kLog2e);
  F sums = Isa::fzero();
  for (; i + Isa::L <= n; i += Isa::L) {
    const F v = Isa::fmax(Isa::fsub(Isa::fload(x + i), s), lowest);
    const F k = Isa::fround(Isa::mul(v, log2e));
    const F r = Isa::fmadd(k, Isa::fset1(-kLn2Lo), Isa::fmadd(k, Isa::fset1(-kLn2Hi), v));
    F p = Isa::fmadd(Isa::fset1(kP0), r, Isa::fset1(kP1));
    p = Isa::fmadd(p, r, Isa::fset1(kP2));
    p = Isa::fmadd(p, r, Isa::fset1(kP3));
    p = Isa::fmadd(p, r, Isa::fset1(kP4));
    p = Isa::fmadd(p, r, Isa::fset1(kP5));
    p = Isa::fmadd(p, Isa::mul(r, r), Isa::fadd(r, Isa::fset1(1.f)));
    const F e = Isa::times_pow2(p, k);
    Isa::store(x + i, e);
    sums = Isa::fadd(sums, e);
  }
  total = Isa::fsum(sums);
#endif
  for (; i < n; ++i) {
    x[i] = exp_shifted(x[i], shift);
    total += x[i];
  }
  return total;
}

}  // namespace

// q [T, H, D]; k_cache, v_cache [KVH, S_max, D] (one layer, contiguous); positions [T] int64 (the queries'
// absolute positions; query t attends keys max(0, p_t - window + 1) .. p_t; window <= 0: no window).
// Returns [T, H, D] float32. One job is a query row and a key/value head with the query heads that share
// it (grouped-query attention): each key and value is read once for all of them.
torch::Tensor row_attention(const torch::Tensor& q_in, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& positions, int64_t window) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(),
              "q [T, H, D], caches [KVH, S, D]");
  TORCH_CHECK(k_cache.scalar_type() == torch::kFloat && v_cache.scalar_type() == torch::kFloat &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches: contiguous float32");
  const auto q = q_in.to(torch::kFloat).contiguous();
  const auto pos = positions.to(torch::kLong).contiguous();
  const int64_t n_q = q.size(0), n_heads = q.size(1), d = q.size(2);
  const int64_t n_kv = k_cache.size(0), s_max = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == d && n_heads % n_kv == 0 && pos.numel() == n_q, "shapes disagree");
  const int64_t group = n_heads / n_kv;
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < n_q; ++t) TORCH_CHECK(p[t] >= 0 && p[t] < s_max, "position out of the cache");
  auto out = torch::empty({n_q, n_heads, d}, torch::kFloat);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  at::parallel_for(0, n_q * n_kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, totals(group);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / n_kv, kv = job % n_kv;
      const int64_t last = p[t], first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
      const int64_t span = last - first + 1;
      const float* queries = qp + (t * n_heads + kv * group) * d;  // [group, D]
      const float* keys = kp + kv * s_max * d;
      const float* values = vp + kv * s_max * d;
      scores.resize(group * span);  // [group, span]
      for (int64_t s = first; s <= last; ++s) {
        for (int64_t g = 0; g < group; ++g) {
          scores[g * span + s - first] = dot(queries + g * d, keys + s * d, static_cast<int>(d)) * scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * span;
        const float top = *std::max_element(row, row + span);
        totals[g] = exp_all(row, span, top);
      }
      float* rows = op + (t * n_heads + kv * group) * d;  // [group, D]
      std::fill(rows, rows + group * d, 0.f);
      for (int64_t s = first; s <= last; ++s) {
        const float* value = values + s * d;
        for (int64_t g = 0; g < group; ++g) {
          const float weight = scores[g * span + s - first] / totals[g];
          float* row = rows + g * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) row[i] += weight * value[i];
        }
      }
    }
  });
  return out;
}

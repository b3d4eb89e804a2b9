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

namespace {

inline float dot(const float* a, const float* b, int n) {
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

}  // namespace

// q [T, H, D]; k_cache, v_cache [KVH, S_max, D] (one layer, contiguous); positions [T] int64 (the queries'
// absolute positions; query t attends keys max(0, p_t - window + 1) .. p_t; window <= 0: no window).
// Returns [T, H, D] float32.
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
  at::parallel_for(0, n_q * n_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / n_heads, h = job % n_heads, kv = h / group;
      const int64_t last = p[t], first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
      const float* query = qp + (t * n_heads + h) * d;
      const float* keys = kp + kv * s_max * d;
      const float* values = vp + kv * s_max * d;
      scores.resize(last - first + 1);
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t s = first; s <= last; ++s) {
        scores[s - first] = dot(query, keys + s * d, static_cast<int>(d)) * scale;
        top = std::max(top, scores[s - first]);
      }
      float total = 0.f;
      for (auto& score : scores) {
        score = std::exp(score - top);
        total += score;
      }
      float* row = op + (t * n_heads + h) * d;
      std::fill(row, row + d, 0.f);
      for (int64_t s = first; s <= last; ++s) {
        const float weight = scores[s - first] / total;
        const float* value = values + s * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) row[i] += weight * value[i];
      }
    }
  });
  return out;
}

// One decoder layer of a forward of a few ids (decode steps, verifies, a first block), in one call.
//
// Why: on the kernels of this module the matrices of the 0.5B draft take ~4.5 ms of its ~7.5 ms step, and
// what remains is PyTorch dispatching ~70 small operations a layer (norms, rope, cache writes, reshapes,
// adds: ~1,700 a step, 1-3 us each, on one core while the other waits). Here a layer is one call from
// Python: the same products (quantize_rows / matmul, quantize_rows32 / matmul32), the same attention
// (row_attention) and the element-wise steps on the rows in plain loops.
//
// Every step treats each row alone, so a row's output does not depend on the rows that share its call:
// a verify's rows equal plain decoding's bit for bit, as on the unfused path. The element-wise steps round
// differently from PyTorch's (another summation order in the norm, the compiler's fused multiply-adds),
// so the fused and the unfused forwards are not bit-equal to each other; the engine uses one of them for
// every forward of at most ROW_ATTENTION_MAX_IDS ids (engine/model.py).
#include <torch/extension.h>
#include <pybind11/stl.h>

#include <cmath>
#include <tuple>
#include <vector>

// engine/cpu_kernels/gguf_mm.cpp and group32.cpp
std::vector<torch::Tensor> quantize_rows(const torch::Tensor& x);
torch::Tensor matmul(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum,
                     const torch::Tensor& blocks, int64_t n, bool q6, bool simd);
std::vector<torch::Tensor> quantize_rows32(const torch::Tensor& x);
torch::Tensor matmul32(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum,
                       const torch::Tensor& blocks, int64_t n, bool bytes, bool simd);
// engine/cpu_kernels/attention.cpp
torch::Tensor row_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& positions, int64_t window);

namespace {

// The block types of engine/cpu_kernels/pack.py, as Python names them.
enum class Kind { Q4_K, Q6_K, Q4_0, Q8_0 };

Kind kind_of(const std::string& name) {
  if (name == "Q4_K") return Kind::Q4_K;
  if (name == "Q6_K") return Kind::Q6_K;
  if (name == "Q4_0") return Kind::Q4_0;
  if (name == "Q8_0") return Kind::Q8_0;
  TORCH_CHECK(false, "no kernel for block type ", name);
}

struct Part {
  torch::Tensor blocks;  // packed, uint8
  int64_t n;             // output channels
  Kind kind;
};

// One projection: packed matrices of one input side by side (y = [x W_1^T, x W_2^T, ...] + bias).
struct Projection {
  std::vector<Part> parts;
  torch::Tensor bias;  // [N] float32, or undefined
  int64_t n = 0;

  Projection(const std::vector<std::tuple<torch::Tensor, int64_t, std::string>>& packed,
             const c10::optional<torch::Tensor>& bias_in) {
    TORCH_CHECK(!packed.empty(), "a projection needs at least one packed matrix");
    for (const auto& [blocks, out, kind] : packed) {
      TORCH_CHECK(blocks.scalar_type() == torch::kUInt8 && blocks.is_contiguous(), "blocks: contiguous uint8");
      parts.push_back({blocks, out, kind_of(kind)});
      n += out;
    }
    if (bias_in.has_value()) {
      bias = bias_in->to(torch::kFloat).contiguous();
      TORCH_CHECK(bias.numel() == n, "bias: ", n, " values");
    }
  }

  // x [T, K] float32 -> [T, N] float32. The rows are rounded to int8 once per block family (the K-quants'
  // 256, the 32-wide types' 32), as each part alone would round them.
  torch::Tensor operator()(const torch::Tensor& x) const {
    std::vector<torch::Tensor> per256, per32, outputs;
    for (const auto& part : parts) {
      const bool k_quant = part.kind == Kind::Q4_K || part.kind == Kind::Q6_K;
      if (k_quant) {
        if (per256.empty()) per256 = quantize_rows(x);
        outputs.push_back(matmul(per256[0], per256[1], per256[2], part.blocks, part.n, part.kind == Kind::Q6_K, true));
      } else {
        if (per32.empty()) per32 = quantize_rows32(x);
        outputs.push_back(matmul32(per32[0], per32[1], per32[2], part.blocks, part.n, part.kind == Kind::Q8_0, true));
      }
    }
    auto y = outputs.size() == 1 ? outputs[0] : torch::cat(outputs, 1);
    if (bias.defined()) y.add_(bias);
    return y;
  }
};

// out[t] = weight * (x[t] / sqrt(mean(x[t]^2) + eps)); x, out [T, dim].
void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = x + t * dim;
    float squares = 0.f;
    for (int64_t i = 0; i < dim; ++i) squares += row[i] * row[i];
    const float inverse = 1.f / std::sqrt(squares / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[t * dim + i] = weight[i] * (row[i] * inverse);
  }
}

// Rotates one head's vector in place (rotate-half layout): x * cos + [-x2, x1] * sin.
void rope(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

class NativeLayer {
 public:
  NativeLayer(torch::Tensor attention_norm, Projection qkv, Projection wo, torch::Tensor ffn_norm, Projection w13,
              Projection w2, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window, double eps)
      : attention_norm_(attention_norm.to(torch::kFloat).contiguous()),
        ffn_norm_(ffn_norm.to(torch::kFloat).contiguous()),
        qkv_(std::move(qkv)),
        wo_(std::move(wo)),
        w13_(std::move(w13)),
        w2_(std::move(w2)),
        n_heads_(n_heads),
        n_kv_heads_(n_kv_heads),
        head_dim_(head_dim),
        window_(window),
        eps_(static_cast<float>(eps)) {
    dim_ = attention_norm_.numel();
    TORCH_CHECK(qkv_.n == (n_heads + 2 * n_kv_heads) * head_dim, "qkv: ", qkv_.n, " outputs for these heads");
    TORCH_CHECK(wo_.n == dim_ && w2_.n == dim_ && w13_.n % 2 == 0, "projections disagree with dim ", dim_);
  }

  // x [T, dim] float32; cos, sin [T, D] at the ids' positions [T] int64; k_cache, v_cache [KVH, S, D]
  // float32 (this layer's, written at the positions). Returns the layer's output [T, dim] float32.
  torch::Tensor forward(const torch::Tensor& x_in, const torch::Tensor& cos_in, const torch::Tensor& sin_in,
                        const torch::Tensor& positions, torch::Tensor& k_cache, torch::Tensor& v_cache) const {
    TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == dim_ && x_in.scalar_type() == torch::kFloat, "x: [T, dim] float32");
    TORCH_CHECK(k_cache.dim() == 3 && k_cache.size(0) == n_kv_heads_ && k_cache.size(2) == head_dim_ &&
                    k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == torch::kFloat &&
                    v_cache.sizes() == k_cache.sizes(),
                "caches: contiguous float32 [KVH, S, D]");
    const auto x = x_in.contiguous();
    const auto cos = cos_in.to(torch::kFloat).contiguous(), sin = sin_in.to(torch::kFloat).contiguous();
    const auto pos = positions.to(torch::kLong).contiguous();
    const int64_t rows = x.size(0), d = head_dim_, s_max = k_cache.size(1);
    TORCH_CHECK(cos.size(0) == rows && cos.size(1) == d && sin.sizes() == cos.sizes() && pos.numel() == rows,
                "cos, sin [T, D] and positions [T] for every row");
    const int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t t = 0; t < rows; ++t) TORCH_CHECK(p[t] >= 0 && p[t] < s_max, "position out of the cache");

    auto normed = torch::empty_like(x);
    rms_norm(x.data_ptr<float>(), attention_norm_.data_ptr<float>(), rows, dim_, eps_, normed.data_ptr<float>());
    auto qkv = qkv_(normed);  // [T, (H + 2 KVH) D]
    const int64_t q_size = n_heads_ * d, kv_size = n_kv_heads_ * d, width = q_size + 2 * kv_size;
    auto q = torch::empty({rows, n_heads_, d}, torch::kFloat);
    float* qp = q.data_ptr<float>();
    float* kp = k_cache.data_ptr<float>();
    float* vp = v_cache.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    float* all = qkv.data_ptr<float>();
    for (int64_t t = 0; t < rows; ++t) {
      float* row = all + t * width;
      for (int64_t h = 0; h < n_heads_; ++h) {
        rope(row + h * d, cp + t * d, sp + t * d, d);
        std::copy(row + h * d, row + (h + 1) * d, qp + (t * n_heads_ + h) * d);
      }
      for (int64_t h = 0; h < n_kv_heads_; ++h) {
        float* key = row + q_size + h * d;
        rope(key, cp + t * d, sp + t * d, d);
        std::copy(key, key + d, kp + (h * s_max + p[t]) * d);
        const float* value = row + q_size + kv_size + h * d;
        std::copy(value, value + d, vp + (h * s_max + p[t]) * d);
      }
    }
    auto attended = row_attention(q, k_cache, v_cache, pos, window_);  // [T, H, D]
    auto out = wo_(attended.reshape({rows, q_size}));                 // [T, dim]
    out.add_(x);
    rms_norm(out.data_ptr<float>(), ffn_norm_.data_ptr<float>(), rows, dim_, eps_, normed.data_ptr<float>());
    auto gate_up = w13_(normed);  // [T, 2I]
    const int64_t inner = w13_.n / 2;
    // ATen's vectorised SiLU (a scalar exp a value cost ~1.2 ms a step of the 1.5B target's 250k values).
    auto act = at::silu(gate_up.narrow(1, 0, inner)).mul_(gate_up.narrow(1, inner, inner));  // [T, I]
    auto down = w2_(act);  // [T, dim]
    down.add_(out);
    return down;
  }

 private:
  torch::Tensor attention_norm_, ffn_norm_;
  Projection qkv_, wo_, w13_, w2_;
  int64_t n_heads_, n_kv_heads_, head_dim_, window_;
  float eps_;
  int64_t dim_ = 0;
};

}  // namespace

// The calls compute on tensors alone, so they let go of Python's lock: the process's other threads (the
// event loop, the recogniser's and the voice's Python code) run beside a forward instead of waiting for
// each layer's call to return.
void register_layer(py::module& m) {
  const auto unlocked = py::call_guard<py::gil_scoped_release>();
  py::class_<Projection>(m, "Projection")
      .def(py::init<const std::vector<std::tuple<torch::Tensor, int64_t, std::string>>&,
                    const c10::optional<torch::Tensor>&>(),
           "packed matrices [(blocks, n, type name)] side by side, and an optional bias [N]", py::arg("parts"),
           py::arg("bias") = py::none())
      .def("__call__", &Projection::operator(), "x [T, K] float32 -> [T, N] float32", py::arg("x"), unlocked);
  py::class_<NativeLayer>(m, "NativeLayer")
      .def(py::init<torch::Tensor, Projection, Projection, torch::Tensor, Projection, Projection, int64_t, int64_t,
                    int64_t, int64_t, double>(),
           py::arg("attention_norm"), py::arg("qkv"), py::arg("wo"), py::arg("ffn_norm"), py::arg("w13"),
           py::arg("w2"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("window"),
           py::arg("eps"))
      .def("forward", &NativeLayer::forward, "x [T, dim], cos/sin [T, D], positions [T], caches [KVH, S, D]",
           py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("k_cache"),
           py::arg("v_cache"), unlocked);
}

// The GGUF's K-quant matrices times int8 activations, for a few rows at once, with every block of weights
// unpacked once and used for all the rows.
//
// Why: decoding one id reads every weight once (bound by memory), and a verify of gamma + 1 ids or a prefill
// of a few ids should cost about the same. llama.cpp's CPU kernels unpack a block of 4-bit weights for every
// row of activations (or for 4 at a time after repacking), so on two cores its forward grows by ~21-55 ms an
// id. Here the unpacked weights of one block stay in registers while up to MAX_ROWS rows use them.
//
// Layout (made by engine/cpu_kernels/pack.py): a matrix [N, K] is cut into tiles of 16 output channels and
// super-blocks of 256 inputs, one contiguous block per (tile, super-block). Within a block a "k4 vector" is 64
// bytes: byte 4c + i holds the weight of channel c at input k0 + i, the shape VNNI's dot product (vpdpbusd:
// 4 unsigned bytes times 4 signed bytes, summed into each int32 lane) wants.
//   Q4_K block (2368 bytes): quants [8 groups][4 pairs][64]: one pair packs k4 vector 2p in its low nibbles
//     and 2p + 1 in its high ones; then sc [8][16] u8, m [8][16] u8, d [16] fp16, dmin [16] fp16.
//     w = d * sc[g] * q - dmin * m[g]   (the file's values, no rounding)
//   Q6_K block (3360 bytes): low 4 bits as Q4_K's quants (2048), high 2 bits [16 groups of 16][64] (the
//     group's 4 k4 vectors at bits 0-1, 2-3, 4-5, 6-7), sc [16][16] int8, d [16] fp16.
//     w = d * sc[h] * (q - 32)
// Activations: per row and super-block one fp32 scale and 256 int8 values (as llama.cpp's Q8_K), and the
// sums of the int8 values per 16 (for the mins and Q6_K's offset). Integer dot products are exact, and a row
// never meets another row's values, so a row's output is the same whatever rows share its call.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "simd.h"

namespace {

using namespace cpu_kernels;

constexpr int TILE = 16;         // output channels per tile
constexpr int SUPER = 256;       // inputs per super-block
constexpr int Q4_BLOCK = 2368;   // bytes per Q4_K (tile, super-block)
constexpr int Q6_BLOCK = 3360;   // bytes per Q6_K (tile, super-block)
constexpr int MAX_ROWS = 8;      // rows that share one unpacking
struct Rows {
  const int8_t* xq;      // [M, K]
  const float* xs;       // [M, K / 256]
  const int32_t* xsum;   // [M, K / 16]
  int64_t k;
  int n_super() const { return static_cast<int>(k / SUPER); }
  const int8_t* q(int m) const { return xq + m * k; }
  float scale(int m, int b) const { return xs[m * (k / SUPER) + b]; }
  int32_t sum16(int m, int h) const { return xsum[m * (k / 16) + h]; }
  const int32_t* sums16(int m, int b) const { return xsum + m * (k / 16) + b * 16; }  // super-block b's 16
};

// ---------------------------------------------------------------- scalar reference (any CPU)

void q4k_tile_scalar(const uint8_t* tile, const Rows& x, int r0, int rows, float* y, int64_t ldy) {
  for (int m = 0; m < rows; ++m) {
    for (int c = 0; c < TILE; ++c) {
      float total = 0.f;
      for (int b = 0; b < x.n_super(); ++b) {
        const uint8_t* blk = tile + static_cast<int64_t>(b) * Q4_BLOCK;
        const uint8_t *sc = blk + 2048, *mn = blk + 2176;
        const uint16_t* d = reinterpret_cast<const uint16_t*>(blk + 2304);
        const uint16_t* dmin = reinterpret_cast<const uint16_t*>(blk + 2336);
        const int8_t* xq = x.q(r0 + m) + b * SUPER;
        int32_t acc_sc = 0, acc_m = 0;
        for (int g = 0; g < 8; ++g) {
          int32_t dot = 0;
          for (int j = 0; j < 8; ++j) {
            const uint8_t* pair = blk + (g * 4 + j / 2) * 64 + 4 * c;
            for (int i = 0; i < 4; ++i) {
              const int q = (j & 1) ? (pair[i] >> 4) : (pair[i] & 0x0F);
              dot += q * xq[g * 32 + 4 * j + i];
            }
          }
          acc_sc += dot * sc[g * 16 + c];
          acc_m += mn[g * 16 + c] * (x.sum16(r0 + m, b * 16 + 2 * g) + x.sum16(r0 + m, b * 16 + 2 * g + 1));
        }
        total += x.scale(r0 + m, b) *
                 (half_to_float(d[c]) * static_cast<float>(acc_sc) - half_to_float(dmin[c]) * static_cast<float>(acc_m));
      }
      y[m * ldy + c] = total;
    }
  }
}

void q6k_tile_scalar(const uint8_t* tile, const Rows& x, int r0, int rows, float* y, int64_t ldy) {
  for (int m = 0; m < rows; ++m) {
    for (int c = 0; c < TILE; ++c) {
      float total = 0.f;
      for (int b = 0; b < x.n_super(); ++b) {
        const uint8_t* blk = tile + static_cast<int64_t>(b) * Q6_BLOCK;
        const uint8_t* high = blk + 2048;
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 3072);
        const uint16_t* d = reinterpret_cast<const uint16_t*>(blk + 3328);
        const int8_t* xq = x.q(r0 + m) + b * SUPER;
        int32_t acc = 0;
        for (int h = 0; h < 16; ++h) {
          int32_t dot = 0;
          for (int jj = 0; jj < 4; ++jj) {
            const int j = (h % 2) * 4 + jj, g = h / 2;
            const uint8_t* pair = blk + (g * 4 + j / 2) * 64 + 4 * c;
            for (int i = 0; i < 4; ++i) {
              const int low = (j & 1) ? (pair[i] >> 4) : (pair[i] & 0x0F);
              const int q = low | (((high[h * 64 + 4 * c + i] >> (2 * jj)) & 3) << 4);
              dot += q * xq[g * 32 + 4 * j + i];
            }
          }
          acc += (dot - 32 * x.sum16(r0 + m, b * 16 + h)) * sc[h * 16 + c];
        }
        total += x.scale(r0 + m, b) * half_to_float(d[c]) * static_cast<float>(acc);
      }
      y[m * ldy + c] = total;
    }
  }
}

#ifdef GGUF_MM_SIMD

// A Q4_K super-block's mins term for one vector of channels: the sum over its 8 groups of min[g][c] times
// the row's sum of int8 values over group g. A min is 6 bits and a group's sum at most 32 * 127 in
// magnitude, so both fit int16: the groups go in pairs, one exact multiply-add of 16-bit pairs each
// (vpdpwssd) instead of a 32-bit multiply and an add per group, which ran on the same port as the dot
// products (multi-row products ~7% faster: bench/results/2026-12-07-cpu-xeon-amx-167-mins-pairs.md).
struct MinPairs {
  I pairs[4];  // lane c: min[2h][c] in its low 16 bits, min[2h + 1][c] in its high ones

  explicit MinPairs(const uint8_t* mins) {  // mins: [8 groups][16 channels] u8, from this vector's lane0
    for (int h = 0; h < 4; ++h) {
      pairs[h] = Isa::or_(Isa::u8_to_i32(mins + 2 * h * 16), Isa::shl32<16>(Isa::u8_to_i32(mins + (2 * h + 1) * 16)));
    }
  }

  // sum16: the row's sums per 16 inputs over this super-block [16].
  I times(const int32_t* sum16) const {
    I total = Isa::zero();
    for (int h = 0; h < 4; ++h) {
      const int32_t low = sum16[4 * h] + sum16[4 * h + 1], high = sum16[4 * h + 2] + sum16[4 * h + 3];
      const uint32_t both = (static_cast<uint32_t>(high) << 16) | (static_cast<uint32_t>(low) & 0xFFFFu);
      total = Isa::dot16(total, pairs[h], Isa::set1(static_cast<int32_t>(both)));
    }
    return total;
  }
};

// Channels [lane0, lane0 + L) of one Q4_K tile, rows r0 .. r0 + MR - 1.
template <int MR>
void q4k_slice(const uint8_t* tile, const Rows& x, int r0, int lane0, float* y, int64_t ldy) {
  const I low4 = Isa::bytes(0x0F);
  F out[MR];
  for (int m = 0; m < MR; ++m) out[m] = Isa::fzero();
  for (int b = 0; b < x.n_super(); ++b) {
    const uint8_t* blk = tile + static_cast<int64_t>(b) * Q4_BLOCK;
    const uint8_t* quants = blk + 4 * lane0;
    I acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = Isa::zero();
    for (int g = 0; g < 8; ++g) {
      if (lane0 == 0) prefetch_lines(blk + PREFETCH_BLOCKS * Q4_BLOCK + g * 5 * 64, 5);  // 37 lines a block
      I dot[MR];
      for (int m = 0; m < MR; ++m) dot[m] = Isa::zero();
      for (int p = 0; p < 4; ++p) {
        const I packed = Isa::load(quants + (g * 4 + p) * 64);
        const I u0 = Isa::and_(packed, low4), u1 = Isa::and_(Isa::shr16<4>(packed), low4);
        const int k = b * SUPER + g * 32 + p * 8;
        for (int m = 0; m < MR; ++m) {
          const int8_t* xq = x.q(r0 + m) + k;
          dot[m] = Isa::dot(dot[m], u0, Isa::set1(load_i32(xq)));
          dot[m] = Isa::dot(dot[m], u1, Isa::set1(load_i32(xq + 4)));
        }
      }
      const I sc = Isa::u8_to_i32(blk + 2048 + g * 16 + lane0);
      for (int m = 0; m < MR; ++m) acc[m] = Isa::add(acc[m], Isa::mullo(dot[m], sc));
    }
    const F d = Isa::half_to_f32(blk + 2304 + 2 * lane0), dmin = Isa::half_to_f32(blk + 2336 + 2 * lane0);
    const MinPairs pairs(blk + 2176 + lane0);
    for (int m = 0; m < MR; ++m) {
      const I mins = pairs.times(x.sums16(r0 + m, b));
      const F block = Isa::fmsub(d, Isa::to_f32(acc[m]), Isa::mul(dmin, Isa::to_f32(mins)));
      out[m] = Isa::fmadd(Isa::fset1(x.scale(r0 + m, b)), block, out[m]);
    }
  }
  for (int m = 0; m < MR; ++m) Isa::store(y + m * ldy + lane0, out[m]);
}

// The high 2 bits of k4 vector jj of a group of 16, moved to bits 4-5 of each byte.
template <int JJ>
inline I q6_high(I high) {
  const I mask = Isa::bytes(0x30);
  if constexpr (2 * JJ <= 4) {
    return Isa::and_(Isa::shl16<4 - 2 * JJ>(high), mask);
  } else {
    return Isa::and_(Isa::shr16<2 * JJ - 4>(high), mask);
  }
}

template <int MR, int JJ>
inline void q6_step(const uint8_t* quants, I high, const Rows& x, int r0, int k_group, int h, I* dot) {
  const I low4 = Isa::bytes(0x0F);
  const int j = (h % 2) * 4 + JJ;  // k4 vector within the group of 32
  const I packed = Isa::load(quants + ((h / 2) * 4 + j / 2) * 64);
  const I low = (j & 1) ? Isa::and_(Isa::shr16<4>(packed), low4) : Isa::and_(packed, low4);
  const I u = Isa::or_(low, q6_high<JJ>(high));
  for (int m = 0; m < MR; ++m) dot[m] = Isa::dot(dot[m], u, Isa::set1(load_i32(x.q(r0 + m) + k_group + 4 * j)));
}

template <int MR>
void q6k_slice(const uint8_t* tile, const Rows& x, int r0, int lane0, float* y, int64_t ldy) {
  F out[MR];
  for (int m = 0; m < MR; ++m) out[m] = Isa::fzero();
  for (int b = 0; b < x.n_super(); ++b) {
    const uint8_t* blk = tile + static_cast<int64_t>(b) * Q6_BLOCK;
    const uint8_t* quants = blk + 4 * lane0;
    I acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = Isa::zero();
    for (int h = 0; h < 16; ++h) {
      if (lane0 == 0) prefetch_lines(blk + PREFETCH_BLOCKS * Q6_BLOCK + h * 4 * 64, 4);  // 53 lines a block
      const I high = Isa::load(blk + 2048 + h * 64 + 4 * lane0);
      const int k_group = b * SUPER + (h / 2) * 32;
      I dot[MR];
      for (int m = 0; m < MR; ++m) dot[m] = Isa::zero();
      q6_step<MR, 0>(quants, high, x, r0, k_group, h, dot);
      q6_step<MR, 1>(quants, high, x, r0, k_group, h, dot);
      q6_step<MR, 2>(quants, high, x, r0, k_group, h, dot);
      q6_step<MR, 3>(quants, high, x, r0, k_group, h, dot);
      const I sc = Isa::s8_to_i32(blk + 3072 + h * 16 + lane0);
      for (int m = 0; m < MR; ++m) {
        const I centred = Isa::sub(dot[m], Isa::set1(32 * x.sum16(r0 + m, b * 16 + h)));
        acc[m] = Isa::add(acc[m], Isa::mullo(centred, sc));
      }
    }
    const F d = Isa::half_to_f32(blk + 3328 + 2 * lane0);
    for (int m = 0; m < MR; ++m) {
      out[m] = Isa::fmadd(Isa::mul(d, Isa::fset1(x.scale(r0 + m, b))), Isa::to_f32(acc[m]), out[m]);
    }
  }
  for (int m = 0; m < MR; ++m) Isa::store(y + m * ldy + lane0, out[m]);
}

template <bool Q6, int MR>
void tile_rows(const uint8_t* tile, const Rows& x, int r0, float* y, int64_t ldy) {
  for (int lane0 = 0; lane0 < TILE; lane0 += Isa::L) {
    if constexpr (Q6) {
      q6k_slice<MR>(tile, x, r0, lane0, y, ldy);
    } else {
      q4k_slice<MR>(tile, x, r0, lane0, y, ldy);
    }
  }
}

template <bool Q6>
void tile_simd(const uint8_t* tile, const Rows& x, int r0, int rows, float* y, int64_t ldy) {
  with_rows(rows, [&](auto mr) { tile_rows<Q6, decltype(mr)::value>(tile, x, r0, y, ldy); });
}
#endif

}  // namespace

// Below: what other files of the module call (engine/cpu_kernels/layer.cpp), and the module itself.

void check_rows(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum) {
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == torch::kInt8 && xq.is_contiguous(), "xq: [M, K] int8");
  TORCH_CHECK(xq.size(1) % SUPER == 0, "K must be a multiple of 256, got ", xq.size(1));
  TORCH_CHECK(xs.scalar_type() == torch::kFloat && xs.is_contiguous() && xs.numel() == xq.numel() / SUPER,
              "xs: [M, K / 256] float32");
  TORCH_CHECK(xsum.scalar_type() == torch::kInt32 && xsum.is_contiguous() && xsum.numel() == xq.numel() / 16,
              "xsum: [M, K / 16] int32");
}

torch::Tensor matmul(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum,
                     const torch::Tensor& blocks, int64_t n, bool q6, bool simd) {
  check_rows(xq, xs, xsum);
  const int64_t m_rows = xq.size(0), k = xq.size(1);
  const int block_bytes = q6 ? Q6_BLOCK : Q4_BLOCK;
  TORCH_CHECK(n % TILE == 0, "N must be a multiple of 16, got ", n);
  TORCH_CHECK(blocks.scalar_type() == torch::kUInt8 && blocks.is_contiguous() &&
                  blocks.numel() == (n / TILE) * (k / SUPER) * block_bytes,
              "blocks: ", n / TILE, " x ", k / SUPER, " x ", block_bytes, " bytes for this N and K");
  auto y = torch::empty({m_rows, n}, torch::kFloat);
  const Rows x{xq.data_ptr<int8_t>(), xs.data_ptr<float>(), xsum.data_ptr<int32_t>(), k};
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const int64_t tile_bytes = (k / SUPER) * block_bytes;
  at::parallel_for(0, n / TILE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* tile = w + t * tile_bytes;
      for (int64_t r0 = 0; r0 < m_rows; r0 += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, m_rows - r0));
        float* y_tile = out + r0 * n + t * TILE;
#ifdef GGUF_MM_SIMD
        if (simd) {
          if (q6) tile_simd<true>(tile, x, static_cast<int>(r0), rows, y_tile, n);
          else tile_simd<false>(tile, x, static_cast<int>(r0), rows, y_tile, n);
          continue;
        }
#endif
        if (q6) q6k_tile_scalar(tile, x, static_cast<int>(r0), rows, y_tile, n);
        else q4k_tile_scalar(tile, x, static_cast<int>(r0), rows, y_tile, n);
      }
    }
  });
  return y;
}

// x [M, K] float32 -> (xq [M, K] int8, xs [M, K / 256] float32, xsum [M, K / 16] int32): per super-block
// the scale that maps its largest magnitude to 127, values rounded to nearest (ties to even).
std::vector<torch::Tensor> quantize_rows(const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2, "x: [M, K]");
  const auto x = x_in.to(torch::kFloat).contiguous();
  const int64_t m_rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % SUPER == 0, "K must be a multiple of 256, got ", k);
  auto xq = torch::empty({m_rows, k}, torch::kInt8);
  auto xs = torch::empty({m_rows, k / SUPER}, torch::kFloat);
  auto xsum = torch::empty({m_rows, k / 16}, torch::kInt);
  const float* src = x.data_ptr<float>();
  int8_t* q = xq.data_ptr<int8_t>();
  float* s = xs.data_ptr<float>();
  int32_t* sums = xsum.data_ptr<int32_t>();
  for (int64_t blk = 0; blk < m_rows * (k / SUPER); ++blk) {
    s[blk] = round_to_int8(src + blk * SUPER, SUPER, 16, q + blk * SUPER, sums + blk * (SUPER / 16));
  }
  return {xq, xs, xsum};
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t n, bool q6) {
  auto rows = quantize_rows(x);
  return matmul(rows[0], rows[1], rows[2], blocks, n, q6, true);
}

// engine/cpu_kernels/group32.cpp
std::vector<torch::Tensor> quantize_rows32(const torch::Tensor& x);
torch::Tensor matmul32(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum,
                       const torch::Tensor& blocks, int64_t n, bool bytes, bool simd);
torch::Tensor linear32(const torch::Tensor& x, const torch::Tensor& blocks, int64_t n, bool bytes);

// engine/cpu_kernels/attention.cpp
torch::Tensor row_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& positions, int64_t window);

// engine/cpu_kernels/layer.cpp
void register_layer(py::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto unlocked = py::call_guard<py::gil_scoped_release>();  // tensors only: Python's lock is let go
  m.def("quantize_rows", &quantize_rows, "x [M, K] -> (xq int8, xs per 256, sums per 16)", unlocked);
  m.def("matmul", &matmul, "quantised rows times packed Q4_K / Q6_K blocks -> [M, N] float32",
        py::arg("xq"), py::arg("xs"), py::arg("xsum"), py::arg("blocks"), py::arg("n"), py::arg("q6"),
        py::arg("simd") = true, unlocked);
  m.def("linear", &linear, "x [M, K] float -> [M, N] float32", py::arg("x"), py::arg("blocks"), py::arg("n"),
        py::arg("q6"), unlocked);
  m.def("row_attention", &row_attention, "q [T, H, D], caches [KVH, S, D] -> [T, H, D], row by row",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"), py::arg("window"), unlocked);
  m.def("quantize_rows32", &quantize_rows32, "x [M, K] -> (xq int8, xs per 32, sums per 32)", unlocked);
  m.def("matmul32", &matmul32, "rows quantised per 32 times packed Q4_0 / Q8_0 blocks -> [M, N] float32",
        py::arg("xq"), py::arg("xs"), py::arg("xsum"), py::arg("blocks"), py::arg("n"), py::arg("bytes"),
        py::arg("simd") = true, unlocked);
  m.def("linear32", &linear32, "x [M, K] float -> [M, N] float32 (Q4_0 / Q8_0)", py::arg("x"),
        py::arg("blocks"), py::arg("n"), py::arg("bytes"), unlocked);
  m.def("isa", &cpu_kernels::isa_name, "the vector instructions this build uses");
  register_layer(m);
}

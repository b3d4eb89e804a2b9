// The GGUF's 32-wide block types (Q4_0, Q8_0) times int8 activations: the kernel of gguf_mm.cpp for
// matrices whose inputs are not a multiple of 256 (the 0.5B draft's 896), where K-quants cannot be used.
//
// Layout (engine/cpu_kernels/pack.py): tiles of 16 output channels, one block per (tile, group of 32
// inputs), tiles contiguous. The quants as k4 vectors (byte 4c + i: channel c, input 4j + i), then d [16]
// fp16.
//   Q4_0 block (288 bytes): quants [4 pairs][64] (k4 vector 2p in the low nibbles, 2p + 1 in the high),
//     w = d * (q - 8)
//   Q8_0 block (544 bytes): quants [8][64] as unsigned bytes q + 128, w = d * (u - 128)
// Activations: per row and group of 32 one fp32 scale, 32 int8 values and their sum (as llama.cpp's Q8_0).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "simd.h"

namespace {

using namespace cpu_kernels;

constexpr int TILE = 16;
constexpr int GROUP = 32;
constexpr int Q4_0_BLOCK = 288;
constexpr int Q8_0_BLOCK = 544;
constexpr int MAX_ROWS = 8;
constexpr int PREFETCH_BYTES = 2048 * PREFETCH_BLOCKS;  // how far ahead the weights are asked for

struct Rows32 {
  const int8_t* xq;     // [M, K]
  const float* xs;      // [M, K / 32]
  const int32_t* xsum;  // [M, K / 32]
  int64_t k;
  int groups() const { return static_cast<int>(k / GROUP); }
  const int8_t* q(int m) const { return xq + m * k; }
  float scale(int m, int g) const { return xs[m * (k / GROUP) + g]; }
  int32_t sum(int m, int g) const { return xsum[m * (k / GROUP) + g]; }
};

template <bool BYTES>
void tile_scalar(const uint8_t* tile, const Rows32& x, int r0, int rows, float* y, int64_t ldy) {
  const int block = BYTES ? Q8_0_BLOCK : Q4_0_BLOCK, quant_bytes = BYTES ? 512 : 256, offset = BYTES ? 128 : 8;
  for (int m = 0; m < rows; ++m) {
    for (int c = 0; c < TILE; ++c) {
      float total = 0.f;
      for (int g = 0; g < x.groups(); ++g) {
        const uint8_t* blk = tile + static_cast<int64_t>(g) * block;
        const int8_t* xq = x.q(r0 + m) + g * GROUP;
        int32_t dot = 0;
        for (int j = 0; j < 8; ++j) {
          for (int i = 0; i < 4; ++i) {
            const int q = BYTES ? blk[j * 64 + 4 * c + i]
                                : ((j & 1) ? blk[(j / 2) * 64 + 4 * c + i] >> 4 : blk[(j / 2) * 64 + 4 * c + i] & 0x0F);
            dot += q * xq[4 * j + i];
          }
        }
        const uint16_t* d = reinterpret_cast<const uint16_t*>(blk + quant_bytes);
        total += half_to_float(d[c]) * x.scale(r0 + m, g) *
                 static_cast<float>(dot - offset * x.sum(r0 + m, g));
      }
      y[m * ldy + c] = total;
    }
  }
}

#ifdef GGUF_MM_SIMD
template <int MR, bool BYTES>
void slice_simd(const uint8_t* tile, const Rows32& x, int r0, int lane0, float* y, int64_t ldy) {
  constexpr int block = BYTES ? Q8_0_BLOCK : Q4_0_BLOCK, quant_bytes = BYTES ? 512 : 256;
  constexpr int offset = BYTES ? 128 : 8;
  const I low4 = Isa::bytes(0x0F);
  F out[MR];
  for (int m = 0; m < MR; ++m) out[m] = Isa::fzero();
  for (int g = 0; g < x.groups(); ++g) {
    const uint8_t* blk = tile + static_cast<int64_t>(g) * block;
    if (lane0 == 0) prefetch_lines(blk + PREFETCH_BYTES, (block + 63) / 64);
    I dot[MR];
    for (int m = 0; m < MR; ++m) dot[m] = Isa::zero();
    // Without VNNI, bytes up to 255 would saturate AVX2's 16-bit pairs: there the weights go back to
    // signed (u ^ 0x80 = u - 128) and the dot is already centred.
    constexpr bool signed_bytes = BYTES && !Isa::kVnni;
    if constexpr (BYTES) {
      for (int j = 0; j < 8; ++j) {
        const I u = Isa::load(blk + j * 64 + 4 * lane0);
        for (int m = 0; m < MR; ++m) {
          const I xs4 = Isa::set1(load_i32(x.q(r0 + m) + g * GROUP + 4 * j));
          if constexpr (signed_bytes) {
            dot[m] = Isa::dot_signed(dot[m], Isa::xor_(u, Isa::bytes(static_cast<int8_t>(0x80))), xs4);
          } else {
            dot[m] = Isa::dot(dot[m], u, xs4);
          }
        }
      }
    } else {
      for (int p = 0; p < 4; ++p) {
        const I packed = Isa::load(blk + p * 64 + 4 * lane0);
        const I u0 = Isa::and_(packed, low4), u1 = Isa::and_(Isa::shr16<4>(packed), low4);
        for (int m = 0; m < MR; ++m) {
          const int8_t* xq = x.q(r0 + m) + g * GROUP + 8 * p;
          dot[m] = Isa::dot(dot[m], u0, Isa::set1(load_i32(xq)));
          dot[m] = Isa::dot(dot[m], u1, Isa::set1(load_i32(xq + 4)));
        }
      }
    }
    const F d = Isa::half_to_f32(blk + quant_bytes + 2 * lane0);
    for (int m = 0; m < MR; ++m) {
      const I centred = signed_bytes ? dot[m] : Isa::sub(dot[m], Isa::set1(offset * x.sum(r0 + m, g)));
      out[m] = Isa::fmadd(Isa::mul(d, Isa::fset1(x.scale(r0 + m, g))), Isa::to_f32(centred), out[m]);
    }
  }
  for (int m = 0; m < MR; ++m) Isa::store(y + m * ldy + lane0, out[m]);
}

template <bool BYTES, int MR>
void tile_rows(const uint8_t* tile, const Rows32& x, int r0, float* y, int64_t ldy) {
  for (int lane0 = 0; lane0 < TILE; lane0 += Isa::L) slice_simd<MR, BYTES>(tile, x, r0, lane0, y, ldy);
}

template <bool BYTES>
void tile_simd(const uint8_t* tile, const Rows32& x, int r0, int rows, float* y, int64_t ldy) {
  with_rows(rows, [&](auto mr) { tile_rows<BYTES, decltype(mr)::value>(tile, x, r0, y, ldy); });
}
#endif

}  // namespace

// x [M, K] float -> (xq [M, K] int8, xs [M, K / 32] float32, xsum [M, K / 32] int32): per group of 32 the
// scale that maps its largest magnitude to 127, values rounded to nearest (ties to even).
std::vector<torch::Tensor> quantize_rows32(const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2, "x: [M, K]");
  const auto x = x_in.to(torch::kFloat).contiguous();
  const int64_t m_rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % GROUP == 0, "K must be a multiple of 32, got ", k);
  auto xq = torch::empty({m_rows, k}, torch::kInt8);
  auto xs = torch::empty({m_rows, k / GROUP}, torch::kFloat);
  auto xsum = torch::empty({m_rows, k / GROUP}, torch::kInt);
  const float* src = x.data_ptr<float>();
  int8_t* q = xq.data_ptr<int8_t>();
  float* s = xs.data_ptr<float>();
  int32_t* sums = xsum.data_ptr<int32_t>();
  for (int64_t blk = 0; blk < m_rows * (k / GROUP); ++blk) {
    s[blk] = round_to_int8(src + blk * GROUP, GROUP, GROUP, q + blk * GROUP, sums + blk);
  }
  return {xq, xs, xsum};
}

torch::Tensor matmul32(const torch::Tensor& xq, const torch::Tensor& xs, const torch::Tensor& xsum,
                       const torch::Tensor& blocks, int64_t n, bool bytes, bool simd) {
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == torch::kInt8 && xq.is_contiguous(), "xq: [M, K] int8");
  const int64_t m_rows = xq.size(0), k = xq.size(1);
  TORCH_CHECK(k % GROUP == 0, "K must be a multiple of 32, got ", k);
  TORCH_CHECK(xs.scalar_type() == torch::kFloat && xs.is_contiguous() && xs.numel() == m_rows * (k / GROUP),
              "xs: [M, K / 32] float32");
  TORCH_CHECK(xsum.scalar_type() == torch::kInt32 && xsum.is_contiguous() && xsum.numel() == m_rows * (k / GROUP),
              "xsum: [M, K / 32] int32");
  TORCH_CHECK(n % TILE == 0, "N must be a multiple of 16, got ", n);
  const int block = bytes ? Q8_0_BLOCK : Q4_0_BLOCK;
  TORCH_CHECK(blocks.scalar_type() == torch::kUInt8 && blocks.is_contiguous() &&
                  blocks.numel() == (n / TILE) * (k / GROUP) * block,
              "blocks: ", n / TILE, " x ", k / GROUP, " x ", block, " bytes for this N and K");
  auto y = torch::empty({m_rows, n}, torch::kFloat);
  const Rows32 x{xq.data_ptr<int8_t>(), xs.data_ptr<float>(), xsum.data_ptr<int32_t>(), k};
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  const int64_t tile_bytes = (k / GROUP) * block;
  at::parallel_for(0, n / TILE, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t r0 = 0; r0 < m_rows; r0 += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, m_rows - r0));
        const uint8_t* tile = w + t * tile_bytes;
        float* y_tile = out + r0 * n + t * TILE;
#ifdef GGUF_MM_SIMD
        if (simd) {
          if (bytes) tile_simd<true>(tile, x, static_cast<int>(r0), rows, y_tile, n);
          else tile_simd<false>(tile, x, static_cast<int>(r0), rows, y_tile, n);
          continue;
        }
#endif
        if (bytes) tile_scalar<true>(tile, x, static_cast<int>(r0), rows, y_tile, n);
        else tile_scalar<false>(tile, x, static_cast<int>(r0), rows, y_tile, n);
      }
    }
  });
  return y;
}

torch::Tensor linear32(const torch::Tensor& x, const torch::Tensor& blocks, int64_t n, bool bytes) {
  auto rows = quantize_rows32(x);
  return matmul32(rows[0], rows[1], rows[2], blocks, n, bytes, true);
}

// The CPU's depthwise weight gradient in the order of rows (depthwise_rows.h) on NCHW float32
// activations, without copying them to NHWC: the layout copies of x and dy took half or more of
// the weight gradient's time fed NCHW (benchmarks/NOTES.md, section 91).
//
// In NCHW a channel's rows are contiguous, so the NHWC kernel's vectors of channels would be
// gathers here. Instead a vector holds one column ow of `lanes` consecutive output rows of one
// channel, and each lane sums its own row along ow, in increasing order: the order of rows, lane
// by lane, so the bits are the NHWC kernel's. To make those reads contiguous, the rows a group of
// rows needs are transposed in cache, per image and channel, to [column][row]: dy's rows, and
// x's rows phase by phase of the row stride (input row q * stride + p is row q of phase p), with
// zero rows for the padding. A lane whose row reads a padding row at a kernel row adds zero, as
// the NHWC kernel's row does; lanes past the group's rows are not added.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "depthwise_nhwc_cpu.h"
#include "depthwise_rows.h"
#include "transpose_copy_cpu.h"
#include "vector_ops.h"

namespace torch_convbp {
namespace {

// Kernel row ki reads, from output row oh, input row oh * stride_h + ki * dilation_h - pad_h:
// row oh + shift of phase `phase` (input row q * stride_h + phase is row q of that phase).
struct KernelRow {
  int64_t phase, shift;
};
KernelRow kernel_row(const ConvShape& s, int64_t ki) {
  const int64_t c = ki * s.dilation_h - s.pad_h;
  return {floor_mod(c, s.stride_h), floor_div(c, s.stride_h)};
}

// One image's channel, the output rows [first, end) of a group transposed for the lanes:
// dy[ow * dy_rows + (oh - first)] and, for phase p, x[(p * width + iw) * x_rows + (q - x_first)].
// Each has `slack` rows past the last one read (zeros), so that a vector read at any row the
// lanes start from stays inside.
struct TransposedRows {
  int64_t first, end, dy_rows, x_first, x_rows;
  std::vector<float> dy, x;

  TransposedRows(const ConvShape& s, int64_t first_row, int64_t end_row, int64_t slack)
      : first(first_row), end(end_row) {
    // the kernel rows' shifts, which grow with ki
    const int64_t lowest = kernel_row(s, 0).shift, highest = kernel_row(s, s.kernel_h - 1).shift;
    dy_rows = end - first + slack;
    x_first = first + lowest;
    x_rows = end - first + highest - lowest + slack;
    dy.assign(s.out_width * dy_rows, 0.0f);
    x.assign(s.stride_h * s.width * x_rows, 0.0f);
  }

  // Transposes channel planes dy_plane [OH, OW] and x_plane [H, W] (the zeros stay where no row
  // is: the padding and the slack).
  void fill(const float* dy_plane, const float* x_plane, const ConvShape& s) {
    transpose_matrix(dy_plane + first * s.out_width, s.out_width, dy.data(), dy_rows, end - first,
                     s.out_width, sizeof(float));
    for (int64_t p = 0; p < s.stride_h; ++p) {
      // the rows q of phase p inside the image, 0 <= q * stride + p < H (so q >= 0), within
      // [x_first, x_first + x_rows)
      const int64_t q_begin = std::max<int64_t>(x_first, 0);
      const int64_t q_end = std::min(x_first + x_rows, floor_div(s.height - 1 - p, s.stride_h) + 1);
      if (q_begin >= q_end) continue;
      transpose_matrix(x_plane + (q_begin * s.stride_h + p) * s.width, s.stride_h * s.width,
                       x.data() + p * s.width * x_rows + (q_begin - x_first), x_rows,
                       q_end - q_begin, s.width, sizeof(float));
    }
  }
};

// The sums of one kernel row's taps for NB vectors of rows from output row oh0 (lanes ascending
// with the rows): for each of the KW taps (ki, kj_first + kj), each lane's products along ow in
// increasing order where the tap reads inside the image. Compiled for the target of Ops
// (run_compiled_for); the sums are written to out [NB][KW][lanes].
template <int KW, int NB>
struct KernelRowSums {
  template <class Ops>
  static TORCH_CONVBP_INLINE void run(const TransposedRows& t, int64_t oh0, int64_t ki,
                                      int64_t kj_first, float* out, const ConvShape& s) {
    using V = typename Vector<float, Ops::kBytes>::type;
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    const KernelRow row = kernel_row(s, ki);
    const float* dy = t.dy.data() + (oh0 - t.first);
    const float* x = t.x.data() + row.phase * s.width * t.x_rows + (oh0 + row.shift - t.x_first);
    Tap taps[KW];
    for (int kj = 0; kj < KW; ++kj) taps[kj] = tap_columns(s, kj_first + kj);
    V sums[NB][KW];
    for (int nb = 0; nb < NB; ++nb) {
      for (int kj = 0; kj < KW; ++kj) sums[nb][kj] = Ops::template splat<V>(0.0f);
    }
    for (int64_t ow = 0; ow < s.out_width; ++ow) {
      V dy_vectors[NB];
      for (int nb = 0; nb < NB; ++nb) {
        std::memcpy(&dy_vectors[nb], dy + ow * t.dy_rows + nb * lanes, sizeof(V));
      }
#pragma GCC unroll 8
      for (int kj = 0; kj < KW; ++kj) {
        if (ow < taps[kj].columns.begin || ow >= taps[kj].columns.end) continue;
        const float* x_column = x + (ow * s.stride_w + taps[kj].offset) * t.x_rows;
        for (int nb = 0; nb < NB; ++nb) {
          V xv;
          std::memcpy(&xv, x_column + nb * lanes, sizeof(V));
          sums[nb][kj] = Ops::multiply_add(dy_vectors[nb], xv, sums[nb][kj]);
        }
      }
    }
    for (int nb = 0; nb < NB; ++nb) {
      for (int kj = 0; kj < KW; ++kj) {
        std::memcpy(out + (nb * KW + kj) * lanes, &sums[nb][kj], sizeof(V));
      }
    }
  }
};

// Adds one image's channel o, rows [t.first, t.end), into totals [taps][Cout]: for every kernel
// row, passes of NB vectors of rows over the taps KW at a time, each lane's sum added in row order
// (zero where its row reads a padding row at that kernel row).
template <int KW, int NB, class Ops>
void add_channel(Ops ops, const TransposedRows& t, int64_t o, float* totals, const ConvShape& s) {
  constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
  float sums[NB * KW * lanes];
  for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
    const KernelRow row = kernel_row(s, ki);
    for (int64_t kj_first = 0; kj_first < s.kernel_w; kj_first += KW) {
      for (int64_t oh0 = t.first; oh0 < t.end; oh0 += NB * lanes) {
        run_compiled_for<KernelRowSums<KW, NB>>(ops, t, oh0, ki, kj_first, sums, s);
        for (int nb = 0; nb < NB; ++nb) {
          for (int64_t l = 0; l < lanes; ++l) {
            const int64_t oh = oh0 + nb * lanes + l;
            if (oh >= t.end) break;
            const int64_t q = oh + row.shift, ih = q * s.stride_h + row.phase;
            const bool inside = ih >= 0 && ih < s.height;
            for (int kj = 0; kj < KW; ++kj) {
              float& total = totals[(ki * s.kernel_w + kj_first + kj) * s.out_channels + o];
              total = total + (inside ? sums[(nb * KW + kj) * lanes + l] : 0.0f);
            }
          }
        }
      }
    }
  }
}

// How many taps of a kernel row a pass takes at once: every tap of a 3- or 5-wide kernel row, a
// tap at a time for any other width; and 16 rows a pass (two vectors of AVX2's, one of
// AVX-512's), so that 6 or 10 chains of multiply-adds are in flight on AVX2.
template <int Lanes, class Body>
void with_pass_shape(const ConvShape& s, Body&& body) {
  constexpr int vectors = Lanes >= 16 ? 1 : 16 / Lanes;
  if (s.kernel_w == 3) {
    body(std::integral_constant<int, 3>{}, std::integral_constant<int, vectors>{});
  } else if (s.kernel_w == 5) {
    body(std::integral_constant<int, 5>{}, std::integral_constant<int, vectors>{});
  } else {
    body(std::integral_constant<int, 1>{}, std::integral_constant<int, vectors>{});
  }
}

}  // namespace

void depthwise_nchw_weight_grad_rows(const Tensor& input, const Tensor& grad_output,
                                     const ConvShape& s, const Tensor& grad_weight) {
  const float* x = input.const_data_ptr<float>();
  const float* dy = grad_output.const_data_ptr<float>();
  const int64_t plane = s.height * s.width, out_plane = s.out_height * s.out_width;
  with_vector_ops([&](auto ops) {
    using Ops = decltype(ops);
    constexpr int64_t lanes = Vector<float, Ops::kBytes>::lanes;
    with_pass_shape<lanes>(s, [&](auto kw, auto nb) {
      constexpr int KW = decltype(kw)::value, NB = decltype(nb)::value;
      weight_grad_in_row_groups<float>(
          s, grad_weight.mutable_data_ptr<float>(),
          [&](int64_t first_row, int64_t end_row, float* totals) {
            for (int64_t n = first_row / s.out_height; n * s.out_height < end_row; ++n) {
              const int64_t first = std::max(first_row - n * s.out_height, int64_t{0});
              const int64_t end = std::min(end_row - n * s.out_height, s.out_height);
              TransposedRows t(s, first, end, NB * lanes);
              for (int64_t o = 0; o < s.out_channels; ++o) {
                t.fill(dy + (n * s.out_channels + o) * out_plane,
                       x + (n * s.in_channels + o) * plane, s);
                add_channel<KW, NB>(ops, t, o, totals, s);
              }
            }
          });
    });
  });
}

}  // namespace torch_convbp

// The CPU im2col and col2im kernels of both layouts (the column matrices: shape.h).
//
// Both are parallel over independent pieces of output (at::parallel_for), so they are race-free,
// and every sum is taken in a fixed order, so they are deterministic whatever the thread count.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../column_types.h"
#include "../taps.h"
#include "cpu_kernels.h"

namespace torch_convbp {
namespace {

// Enough elements per parallel task to be worth a thread.
constexpr int64_t kGrainElements = 32768;

// dst[i] = src[i * stride] for i < n. Stride 1 is a copy (memmove for one dtype); stride 2, the
// stride of most strided convolutions, is spelt out so that the compiler vectorizes it (with
// AVX2 where the CPU has it), faster than the general loop (benchmarks/NOTES.md, section 8).
template <typename image_t, typename column_t>
TORCH_CONVBP_VECTOR_CLONES void gather_strided(const image_t* src, int64_t stride, int64_t n,
                                               column_t* dst) {
  if (stride == 1) {
    std::copy(src, src + n, dst);
  } else if (stride == 2) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<column_t>(src[2 * i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<column_t>(src[i * stride]);
  }
}

// columns[(c, kd, ki, kj), image, row, ow] = images[image, c, input row, iw] (0 in the padding),
// with the input row (id, ih) the one output row `row` (od, oh) reads at (kd, ki) (taps.h) and
// iw = ow*stride_w - pad_w + kj*dilation_w. One task writes one contiguous block: a column-matrix
// row's stretch for one image.
template <typename image_t, typename column_t>
void im2col_kernel(const image_t* images, column_t* columns, const ColumnGeometry& g) {
  const int64_t kernel_area = g.kernel_h * g.kernel_w, taps = g.kernel_d * kernel_area;
  const int64_t volume = g.depth * g.height * g.width;
  const int64_t block = g.rows * g.out_width;
  const int64_t tasks = g.channels * taps * g.images;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(block, 1));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t image = task % g.images, row = task / g.images;  // row = (c, kd, ki, kj)
      const int64_t c = row / taps, kd = row / kernel_area % g.kernel_d;
      const int64_t ki = row / g.kernel_w % g.kernel_h, kj = row % g.kernel_w;
      const image_t* src = images + (image * g.channels + c) * volume;
      column_t* dst = columns + task * block;
      // iw = ow*stride_w + iw_offset
      const int64_t iw_offset = input_index(int64_t{0}, g.stride_w, g.pad_w, kj, g.dilation_w);
      const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
      for (int64_t out_row = g.row_start; out_row < g.row_start + g.rows;
           ++out_row, dst += g.out_width) {
        const int64_t in_row = input_row_reading(g, out_row, kd, ki);
        if (in_row < 0) {
          std::fill_n(dst, g.out_width, column_t(0));
          continue;
        }
        const image_t* src_row = src + in_row * g.width;
        std::fill(dst, dst + valid.begin, column_t(0));
        gather_strided(src_row + valid.begin * g.stride_w + iw_offset, g.stride_w,
                       valid.end - valid.begin, dst + valid.begin);
        std::fill(dst + valid.end, dst + g.out_width, column_t(0));
      }
    }
  });
}

// images[image, c] += the sum of every column entry that im2col copied from it: the adjoint of
// im2col. One task owns one (image, channel) volume and adds its column rows in a fixed order
// (kd, ki, kj, output row, ow) into a float32 (or float64) buffer, then into the volume: no two
// tasks write the same pixel, and every pixel's sum has the same order on every run.
template <typename image_t, typename column_t>
void col2im_kernel(const column_t* columns, image_t* images, const ColumnGeometry& g) {
  using acc_t = at::opmath_type<image_t>;
  const int64_t taps = g.kernel_d * g.kernel_h * g.kernel_w;
  const int64_t volume = g.depth * g.height * g.width;
  const int64_t block = g.rows * g.out_width;
  const InputRows reached_rows = input_rows_reached(g);
  if (reached_rows.count == 0) return;
  const int64_t first_row = reached_rows.first, reached = reached_rows.count * g.width;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (taps * block + 1));
  at::parallel_for(0, g.images * g.channels, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(reached);
    for (int64_t task = begin; task < end; ++task) {  // task = (image, c)
      const int64_t image = task / g.channels, c = task % g.channels;
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t kd = 0; kd < g.kernel_d; ++kd) {
        for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const int64_t row = ((c * g.kernel_d + kd) * g.kernel_h + ki) * g.kernel_w + kj;
            const column_t* src = columns + (row * g.images + image) * block;
            const int64_t iw_offset =
                input_index(int64_t{0}, g.stride_w, g.pad_w, kj, g.dilation_w);
            const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
            for (int64_t out_row = g.row_start; out_row < g.row_start + g.rows;
                 ++out_row, src += g.out_width) {
              const int64_t in_row = input_row_reading(g, out_row, kd, ki);
              if (in_row < 0) continue;
              const int64_t sum_row = (in_row - first_row) * g.width + iw_offset;
              for (int64_t ow = valid.begin; ow < valid.end; ++ow) {
                sum[sum_row + ow * g.stride_w] += static_cast<acc_t>(src[ow]);
              }
            }
          }
        }
      }
      image_t* dst = images + (image * g.channels + c) * volume + first_row * g.width;
      for (int64_t i = 0; i < reached; ++i) {
        dst[i] = static_cast<image_t>(static_cast<acc_t>(dst[i]) + sum[i]);
      }
    }
  });
}

// dst[i] = src[i] for i < n, converting. Inlined, so that it is compiled into (and vectorized
// by) each caller's clone: the NHWC kernels copy runs as short as one group's channels per tap
// (3 in an RGB stem, 4 in ResNeXt's groups), where a call per run cost more than the copy.
template <typename image_t, typename column_t>
TORCH_CONVBP_INLINE void copy_run(const image_t* src, int64_t n, column_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<column_t>(src[i]);
}

// sum[c] += src[c] for c < n; inlined, as copy_run.
template <typename acc_t, typename column_t>
TORCH_CONVBP_INLINE void add_run(const column_t* src, int64_t n, acc_t* sum) {
  for (int64_t c = 0; c < n; ++c) sum[c] += static_cast<acc_t>(src[c]);
}

// Output pixel p of a chunk (ColumnGeometry): its image, output row (depth slices counted
// together) and output column.
struct OutputPixel {
  int64_t image, row, ow;
};
inline OutputPixel output_pixel(const ColumnGeometry& g, int64_t p) {
  const int64_t rest = p / g.out_width;
  return {rest / g.rows, rest % g.rows + g.row_start, p % g.out_width};
}

// Rows [begin, end) of one group's NHWC column matrix [P, kd*kh*kw*C/G] (ColumnGeometry): for each
// tap (kd, ki, kj), the group's C/G channels of the input pixel that output pixel p sees there, 0
// in the padding. A kernel row's taps inside the image are one run where they are adjacent in
// memory (one group, no dilation along the width): kw*C channels in one copy.
template <typename image_t, typename column_t>
TORCH_CONVBP_VECTOR_CLONES void im2col_nhwc_rows(const image_t* images, column_t* columns,
                                                 const ColumnGeometry& g, int64_t group,
                                                 int64_t begin, int64_t end) {
  const int64_t group_channels = g.channels / g.groups;
  const int64_t tap_row_length = g.kernel_w * group_channels;  // one kernel row's entries
  const bool adjacent_taps = g.groups == 1 && g.dilation_w == 1;
  for (int64_t p = begin; p < end; ++p) {
    const OutputPixel out = output_pixel(g, p);
    // iw = iw_first + kj * dilation_w
    const int64_t iw_first = input_index(out.ow, g.stride_w, g.pad_w, int64_t{0}, g.dilation_w);
    const Span taps = valid_columns(iw_first, g.dilation_w, g.width, g.kernel_w);
    column_t* dst = columns + p * g.kernel_d * g.kernel_h * tap_row_length;
    for (int64_t k = 0; k < g.kernel_d * g.kernel_h; ++k, dst += tap_row_length) {  // (kd, ki)
      const int64_t in_row = input_row_reading(g, out.row, k / g.kernel_h, k % g.kernel_h);
      if (in_row < 0) {
        std::fill_n(dst, tap_row_length, column_t(0));
        continue;
      }
      const image_t* src_row = images +
                               (out.image * g.depth * g.height + in_row) * g.width * g.channels +
                               group * group_channels;
      const auto tap_source = [&](int64_t kj) {  // the group's channels that tap kj reads
        return src_row + (iw_first + kj * g.dilation_w) * g.channels;
      };
      std::fill(dst, dst + taps.begin * group_channels, column_t(0));
      if (adjacent_taps) {
        copy_run(tap_source(taps.begin), (taps.end - taps.begin) * g.channels,
                 dst + taps.begin * g.channels);
      } else {
        for (int64_t kj = taps.begin; kj < taps.end; ++kj) {
          copy_run(tap_source(kj), group_channels, dst + kj * group_channels);
        }
      }
      std::fill(dst + taps.end * group_channels, dst + tap_row_length, column_t(0));
    }
  }
}

// The NHWC column matrix [G, P, kd*kh*kw*C/G] (ColumnGeometry): row p of group g holds, for each
// tap (kd, ki, kj), the group's C/G channels of the input pixel that output pixel p sees there, 0
// in the padding. One task takes a tile of pixels, group by group: each group's rows of the tile
// are written in one sequential run, while the input pixels the tile reads stay in cache.
template <typename image_t, typename column_t>
void im2col_nhwc_kernel(const image_t* images, column_t* columns, const ColumnGeometry& g) {
  const int64_t row_length = g.kernel_d * g.kernel_h * g.kernel_w * (g.channels / g.groups);
  const int64_t pixels = g.images * g.rows * g.out_width;
  const int64_t tile = std::max<int64_t>(1, kGrainElements / (row_length * g.groups));
  at::parallel_for(0, (pixels + tile - 1) / tile, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * tile, last = std::min(pixels, first + tile);
      for (int64_t group = 0; group < g.groups; ++group) {
        im2col_nhwc_rows(images, columns + group * pixels * row_length, g, group, first, last);
      }
    }
  });
}

// Input pixels [begin, end) of the rows a chunk reaches (task = (image, row - first, iw), rows of
// all depth slices counted together), each summed as col2im_nhwc_kernel says, with `sum`
// (C entries) as scratch.
template <typename image_t, typename column_t, typename acc_t>
TORCH_CONVBP_VECTOR_CLONES void col2im_nhwc_pixels(const column_t* columns, image_t* images,
                                                   const ColumnGeometry& g, InputRows reached,
                                                   int64_t begin, int64_t end, acc_t* sum) {
  const int64_t group_channels = g.channels / g.groups;
  const int64_t row_length = g.kernel_d * g.kernel_h * g.kernel_w * group_channels;
  const int64_t pixels = g.images * g.rows * g.out_width;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t iw = task % g.width, rest = task / g.width;
    const int64_t row = rest % reached.count + reached.first, image = rest / reached.count;
    std::fill_n(sum, g.channels, acc_t(0));
    for_each_tap_reading(
        g, row / g.height, row % g.height, iw, [&](int64_t tap, int64_t band_row, int64_t ow) {
          const int64_t p = (image * g.rows + band_row) * g.out_width + ow;
          const column_t* entries = columns + p * row_length + tap * group_channels;
          for (int64_t group = 0; group < g.groups; ++group) {
            add_run(entries + group * pixels * row_length, group_channels,
                    sum + group * group_channels);
          }
        });
    image_t* dst = images + ((image * g.depth * g.height + row) * g.width + iw) * g.channels;
    for (int64_t c = 0; c < g.channels; ++c) {
      dst[c] = static_cast<image_t>(static_cast<acc_t>(dst[c]) + sum[c]);
    }
  }
}

// The adjoint of im2col_nhwc, as a gather: each input pixel of the rows the band reaches adds to
// its channels the column entries im2col copied from it, tap by tap in the order (kd, ki, kj), into
// a float32 (float64) sum per channel, then the sums into the pixel. Per channel that is the
// NCHW kernels' order (col2im_kernel above, and both CUDA kernels), so the same columns give the
// same bits in both layouts and on both devices. One task owns whole pixels: no two tasks write
// one element.
template <typename image_t, typename column_t>
void col2im_nhwc_kernel(const column_t* columns, image_t* images, const ColumnGeometry& g) {
  using acc_t = at::opmath_type<image_t>;
  const InputRows reached = input_rows_reached(g);
  if (reached.count == 0) return;
  const int64_t taps = g.kernel_d * g.kernel_h * g.kernel_w;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (taps * g.channels));
  at::parallel_for(0, g.images * reached.count * g.width, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(g.channels);
    col2im_nhwc_pixels(columns, images, g, reached, begin, end, sum.data());
  });
}

template <Layout layout>
void im2col_cpu(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
                IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                const at::Tensor& columns) {
  const char* op = layout == Layout::nhwc ? "torch_convbp.im2col_nhwc" : "torch_convbp.im2col";
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const image_t* src = images.const_data_ptr<image_t>();
    column_t* dst = columns.mutable_data_ptr<column_t>();
    layout == Layout::nhwc ? im2col_nhwc_kernel(src, dst, g) : im2col_kernel(src, dst, g);
  });
}

template <Layout layout>
void col2im_cpu(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                const at::Tensor& images) {
  const char* op = layout == Layout::nhwc ? "torch_convbp.col2im_nhwc" : "torch_convbp.col2im";
  const ColumnGeometry g = check_columns(op, layout, images, columns, kernel_size, stride, padding,
                                         dilation, row_start, rows);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const column_t* src = columns.const_data_ptr<column_t>();
    image_t* dst = images.mutable_data_ptr<image_t>();
    layout == Layout::nhwc ? col2im_nhwc_kernel(src, dst, g) : col2im_kernel(src, dst, g);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("im2col", &im2col_cpu<Layout::nchw>);
  m.impl("col2im", &col2im_cpu<Layout::nchw>);
  m.impl("im2col_nhwc", &im2col_cpu<Layout::nhwc>);
  m.impl("col2im_nhwc", &col2im_cpu<Layout::nhwc>);
}

}  // namespace torch_convbp

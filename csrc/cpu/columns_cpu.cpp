// The CPU im2col and col2im kernels of both layouts (the column matrices: shape.h).
//
// Both are parallel over independent pieces of output (at::parallel_for), so they are race-free,
// and every sum is taken in a fixed order, so they are deterministic whatever the thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
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

// The part of im2col_kernel that an image's im2col is: tap (ki, kj) of output rows [oh_begin,
// oh_end) of one output depth slice, copied to dst (out_width entries a row) from `slice`, the
// input depth slice the tap reads, or zeros where that slice is padding (slice null).
template <typename image_t, typename column_t>
TORCH_CONVBP_INLINE void copy_slice_rows(const image_t* slice, column_t* dst,
                                         const ColumnGeometry& g, int64_t ki, int64_t kj,
                                         int64_t oh_begin, int64_t oh_end) {
  // iw = ow*stride_w + iw_offset
  if (slice == nullptr) {
    std::fill_n(dst, (oh_end - oh_begin) * g.out_width, column_t(0));
    return;
  }
  const int64_t iw_offset = input_index(int64_t{0}, g.stride_w, g.pad_w, kj, g.dilation_w);
  const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
  for (int64_t oh = oh_begin; oh < oh_end; ++oh, dst += g.out_width) {
    const int64_t ih = input_index(oh, g.stride_h, g.pad_h, ki, g.dilation_h);
    if (ih < 0 || ih >= g.height) {
      std::fill_n(dst, g.out_width, column_t(0));
      continue;
    }
    const image_t* src_row = slice + ih * g.width;
    std::fill(dst, dst + valid.begin, column_t(0));
    gather_strided(src_row + valid.begin * g.stride_w + iw_offset, g.stride_w,
                   valid.end - valid.begin, dst + valid.begin);
    std::fill(dst + valid.end, dst + g.out_width, column_t(0));
  }
}

// columns[(c, kd, ki, kj), image, row, ow] = images[image, c, id, ih, iw] (0 in the padding),
// with (id, ih, iw) the input pixel that output row `row` (od, oh) reads at tap (kd, ki, kj):
// id = od*stride_d - pad_d + kd*dilation_d, and ih and iw likewise. One task writes one
// contiguous block: a column-matrix row's stretch for one image.
template <typename image_t, typename column_t>
void im2col_kernel(const image_t* images, column_t* columns, const ColumnGeometry& g) {
  const int64_t kernel_area = g.kernel_h * g.kernel_w, taps = g.kernel_d * kernel_area;
  const int64_t plane = g.height * g.width, volume = g.depth * plane;
  const int64_t block = g.rows * g.out_width;
  const int64_t tasks = g.channels * taps * g.images;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(block, 1));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      // task = ((c, kd, ki, kj), image): as few divisions as may be, one per index of an image's
      // tap (slice_of: none for its depth); this runs once per row of short rows.
      const int64_t row = task / g.images, image = task - row * g.images;
      const int64_t c = row / taps, tap = row - c * taps;
      const int64_t kd = slice_of(tap, kernel_area, g.kernel_d), tap_2d = tap - kd * kernel_area;
      const int64_t ki = tap_2d / g.kernel_w, kj = tap_2d - ki * g.kernel_w;
      const image_t* src = images + (image * g.channels + c) * volume;
      column_t* dst = columns + task * block;
      for_each_band_slice(g, [&](int64_t od, int64_t oh_begin, int64_t oh_end) {
        const int64_t id = input_index(od, g.stride_d, g.pad_d, kd, g.dilation_d);
        const image_t* slice = id >= 0 && id < g.depth ? src + id * plane : nullptr;
        const int64_t band_row = od * g.out_height + oh_begin - g.row_start;
        copy_slice_rows(slice, dst + band_row * g.out_width, g, ki, kj, oh_begin, oh_end);
      });
    }
  });
}

// The part of col2im_kernel that an image's col2im is: for output rows [oh_begin, oh_end) of one
// output depth slice, the column entries of the taps (kd, ki, kj) of one kd, in the order
// (ki, kj, oh, ow), added into `sum` at sum[sum_offset + ih * width + iw] for the input row ih of
// the depth slice they read. `tap_rows`: tap (kd, 0, 0)'s column-matrix stretch for this image,
// from the first of those rows, the next tap's `tap_step` further.
template <typename column_t, typename acc_t>
TORCH_CONVBP_NOINLINE void add_slice_taps(const column_t* tap_rows, int64_t tap_step, acc_t* sum,
                                          int64_t sum_offset, const ColumnGeometry& g,
                                          int64_t oh_begin, int64_t oh_end) {
  const int64_t stride = g.stride_w;
  for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      const column_t* src = tap_rows + (ki * g.kernel_w + kj) * tap_step;
      const int64_t iw_offset = input_index(int64_t{0}, g.stride_w, g.pad_w, kj, g.dilation_w);
      const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
      for (int64_t oh = oh_begin; oh < oh_end; ++oh, src += g.out_width) {
        const int64_t ih = input_index(oh, g.stride_h, g.pad_h, ki, g.dilation_h);
        if (ih < 0 || ih >= g.height) continue;
        int64_t at = sum_offset + ih * g.width + iw_offset + valid.begin * stride;
        for (int64_t ow = valid.begin; ow < valid.end; ++ow, at += stride) {
          sum[at] += static_cast<acc_t>(src[ow]);
        }
      }
    }
  }
}

// images[image, c] += the sum of every column entry that im2col copied from it: the adjoint of
// im2col. One task owns one (image, channel) volume and adds its column rows into a float32 (or
// float64) buffer, then into the volume: no two tasks write the same pixel. Each pixel's terms
// are added in the order (kd, ki, kj) (for one kd, one output slice reads a given input slice),
// the order of the NHWC and CUDA kernels, on every run.
template <typename image_t, typename column_t>
void col2im_kernel(const column_t* columns, image_t* images, const ColumnGeometry& g) {
  using acc_t = at::opmath_type<image_t>;
  const int64_t kernel_area = g.kernel_h * g.kernel_w;
  const int64_t volume = g.depth * g.height * g.width;
  const int64_t block = g.rows * g.out_width;  // a column-matrix row's stretch for one image
  const InputRows reached_rows = input_rows_reached(g);
  if (reached_rows.count == 0) return;
  const int64_t first_row = reached_rows.first, reached = reached_rows.count * g.width;
  const int64_t grain =
      std::max<int64_t>(1, kGrainElements / (g.kernel_d * kernel_area * block + 1));
  at::parallel_for(0, g.images * g.channels, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(reached);
    for (int64_t task = begin; task < end; ++task) {  // task = (image, c)
      const int64_t image = task / g.channels, c = task % g.channels;
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t kd = 0; kd < g.kernel_d; ++kd) {
        const int64_t row = (c * g.kernel_d + kd) * kernel_area;  // column-matrix row (c, kd, 0, 0)
        const column_t* taps = columns + (row * g.images + image) * block;
        for_each_band_slice(g, [&](int64_t od, int64_t oh_begin, int64_t oh_end) {
          const int64_t id = input_index(od, g.stride_d, g.pad_d, kd, g.dilation_d);
          if (id < 0 || id >= g.depth) return;
          const int64_t band_row = od * g.out_height + oh_begin - g.row_start;
          add_slice_taps(taps + band_row * g.out_width, g.images * block, sum.data(),
                         (id * g.height - first_row) * g.width, g, oh_begin, oh_end);
        });
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
// bfloat16 and float16 runs are copied as 16-bit integers: GCC does not vectorize a loop of
// c10::BFloat16 copies, and bfloat16's im2col took more time than its GEMM (NOTES, section 53).
template <typename image_t, typename column_t>
TORCH_CONVBP_INLINE void copy_run(const image_t* src, int64_t n, column_t* dst) {
  if constexpr (std::is_same_v<image_t, column_t> && sizeof(image_t) == 2) {
    const auto* from = reinterpret_cast<const uint16_t*>(src);
    auto* to = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) to[i] = from[i];
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<column_t>(src[i]);
  }
}

// sum[c] += src[c] for c < n; inlined, as copy_run.
template <typename acc_t, typename column_t>
TORCH_CONVBP_INLINE void add_run(const column_t* src, int64_t n, acc_t* sum) {
  for (int64_t c = 0; c < n; ++c) sum[c] += static_cast<acc_t>(src[c]);
}

// Output pixel p of a chunk (ColumnGeometry): its image, output depth slice, row and column.
struct OutputPixel {
  int64_t image, slice, row, ow;
};
inline OutputPixel output_pixel(const ColumnGeometry& g, int64_t p) {
  const int64_t rest = p / g.out_width;
  const int64_t merged_row = rest % g.rows + g.row_start;  // depth slices counted together
  const int64_t slice = slice_of(merged_row, g.out_height, g.out_depth);
  return {rest / g.rows, slice, merged_row - slice * g.out_height, p % g.out_width};
}

// One output pixel's row of a group's NHWC column matrix, `dst` (kd*kh*kw*C/G entries): for each
// kernel row k, the taps [taps.begin, taps.end) of source_rows[k] (the group's channels of the
// input row it reads, null in the padding) from input column iw_first on, 0 elsewhere. A kernel
// row's taps are one run where they are adjacent in memory (adjacent_taps: one group, no dilation
// along the width): kw*C channels in one copy. Inlined into im2col_nhwc_rows' clones, as copy_run.
template <typename image_t, typename column_t>
TORCH_CONVBP_INLINE void pixel_columns(const image_t* const* source_rows, int64_t iw_first,
                                       Span taps, bool adjacent_taps, const ColumnGeometry& g,
                                       column_t* dst) {
  const int64_t group_channels = g.channels / g.groups;
  const int64_t tap_row_length = g.kernel_w * group_channels;  // one kernel row's entries
  for (int64_t k = 0; k < g.kernel_d * g.kernel_h; ++k, dst += tap_row_length) {
    if (source_rows[k] == nullptr) {
      std::fill_n(dst, tap_row_length, column_t(0));
      continue;
    }
    const auto tap_source = [&](int64_t kj) {  // the group's channels that tap kj reads
      return source_rows[k] + (iw_first + kj * g.dilation_w) * g.channels;
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

// Rows [begin, end) of one group's NHWC column matrix [P, kd*kh*kw*C/G] (ColumnGeometry): for each
// tap (kd, ki, kj), the group's C/G channels of the input pixel that output pixel p sees there, 0
// in the padding (pixel_columns). The pixels are taken an output row at a time, the input rows of
// its kernel rows found once per row, and the taps of the pixels away from the edges known
// without a division: with a few channels (an RGB stem's 21 floats a kernel row) the divisions
// per pixel cost as much as its copies (benchmarks/NOTES.md, section 99).
template <typename image_t, typename column_t>
TORCH_CONVBP_VECTOR_CLONES void im2col_nhwc_rows(const image_t* images, column_t* columns,
                                                 const ColumnGeometry& g, int64_t group,
                                                 int64_t begin, int64_t end) {
  const int64_t group_channels = g.channels / g.groups;
  const int64_t row_length = g.kernel_d * g.kernel_h * g.kernel_w * group_channels;
  const bool adjacent_taps = g.groups == 1 && g.dilation_w == 1;
  const int64_t reach_w = (g.kernel_w - 1) * g.dilation_w;  // from a pixel's first tap to its last
  std::vector<const image_t*> source_rows(g.kernel_d * g.kernel_h);  // per kernel row (kd, ki)
  for (int64_t p = begin; p < end;) {
    const OutputPixel out = output_pixel(g, p);
    const int64_t row_end = std::min(end, p + g.out_width - out.ow);
    for (int64_t k = 0; k < g.kernel_d * g.kernel_h; ++k) {
      const int64_t kd = slice_of(k, g.kernel_h, g.kernel_d), ki = k - kd * g.kernel_h;
      const int64_t in_row = input_row_reading(g, out.slice, out.row, kd, ki);
      source_rows[k] =
          in_row < 0 ? nullptr
                     : images + (out.image * g.depth * g.height + in_row) * g.width * g.channels +
                           group * group_channels;
    }
    for (int64_t ow = out.ow; p < row_end; ++p, ++ow) {
      // iw = iw_first + kj * dilation_w
      const int64_t iw_first = input_index(ow, g.stride_w, g.pad_w, int64_t{0}, g.dilation_w);
      const Span taps = iw_first >= 0 && iw_first + reach_w < g.width
                            ? Span{0, g.kernel_w}
                            : valid_columns(iw_first, g.dilation_w, g.width, g.kernel_w);
      pixel_columns(source_rows.data(), iw_first, taps, adjacent_taps, g, columns + p * row_length);
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
    const int64_t id = slice_of(row, g.height, g.depth);
    for_each_tap_reading(
        g, id, row - id * g.height, iw, [&](int64_t tap, int64_t band_row, int64_t ow) {
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

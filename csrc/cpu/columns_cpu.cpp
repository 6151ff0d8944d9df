// The CPU im2col and col2im kernels: the only CPU-specific code of torch_convbp.
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

#include "../column_types.h"
#include "../conv2d.h"
#include "cpu_kernels.h"

namespace torch_convbp {
namespace {

// Enough elements per parallel task to be worth a thread.
constexpr int64_t kGrainElements = 32768;

// dst[i] = src[i * stride] for i < n. Stride 1 is a copy (memmove for one dtype); stride 2, the
// stride of most strided convolutions, is spelt out so that the compiler vectorizes it (with
// AVX2 where the CPU has it): 1.4x faster than the general loop (benchmarks/NOTES.md).
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

// columns[(c, ki, kj), image, oh, ow] = images[image, c, ih, iw] (0 in the padding), with
// ih = oh*stride_h - pad_h + ki*dilation_h and iw likewise. One task writes one contiguous block:
// a column-matrix row's stretch for one image.
template <typename image_t, typename column_t>
void im2col_kernel(const image_t* images, column_t* columns, const ColumnGeometry& g) {
  const int64_t kernel_area = g.kernel_h * g.kernel_w, plane = g.height * g.width;
  const int64_t block = g.rows * g.out_width;
  const int64_t tasks = g.channels * kernel_area * g.images;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(block, 1));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t image = task % g.images, row = task / g.images;  // row = (c, ki, kj)
      const int64_t c = row / kernel_area, ki = row / g.kernel_w % g.kernel_h,
                    kj = row % g.kernel_w;
      const image_t* src = images + (image * g.channels + c) * plane;
      column_t* dst = columns + task * block;
      const int64_t iw_offset = kj * g.dilation_w - g.pad_w;  // iw = ow*stride_w + iw_offset
      const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
      for (int64_t oh = g.row_start; oh < g.row_start + g.rows; ++oh, dst += g.out_width) {
        const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
        if (ih < 0 || ih >= g.height) {
          std::fill_n(dst, g.out_width, column_t(0));
          continue;
        }
        const image_t* src_row = src + ih * g.width;
        std::fill(dst, dst + valid.begin, column_t(0));
        gather_strided(src_row + valid.begin * g.stride_w + iw_offset, g.stride_w,
                       valid.end - valid.begin, dst + valid.begin);
        std::fill(dst + valid.end, dst + g.out_width, column_t(0));
      }
    }
  });
}

// images[image, c] += the sum of every column entry that im2col copied from it: the adjoint of
// im2col. One task owns one (image, channel) plane and adds its kh*kw column rows in a fixed
// order (ki, kj, oh, ow) into a float32 (or float64) buffer, then into the plane: no two tasks
// write the same pixel, and every pixel's sum has the same order on every run.
template <typename image_t, typename column_t>
void col2im_kernel(const column_t* columns, image_t* images, const ColumnGeometry& g) {
  using acc_t = at::opmath_type<image_t>;
  const int64_t kernel_area = g.kernel_h * g.kernel_w, plane = g.height * g.width;
  const int64_t block = g.rows * g.out_width;
  const InputRows reached_rows = input_rows_reached(g);
  if (reached_rows.count == 0) return;
  const int64_t first_ih = reached_rows.first, reached = reached_rows.count * g.width;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (kernel_area * block + 1));
  at::parallel_for(0, g.images * g.channels, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(reached);
    for (int64_t task = begin; task < end; ++task) {  // task = (image, c)
      const int64_t image = task / g.channels, c = task % g.channels;
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
        for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
          const int64_t row = (c * g.kernel_h + ki) * g.kernel_w + kj;
          const column_t* src = columns + (row * g.images + image) * block;
          const int64_t iw_offset = kj * g.dilation_w - g.pad_w;
          const Span valid = valid_columns(iw_offset, g.stride_w, g.width, g.out_width);
          for (int64_t oh = g.row_start; oh < g.row_start + g.rows; ++oh, src += g.out_width) {
            const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
            if (ih < 0 || ih >= g.height) continue;
            const int64_t sum_row = (ih - first_ih) * g.width + iw_offset;
            for (int64_t ow = valid.begin; ow < valid.end; ++ow) {
              sum[sum_row + ow * g.stride_w] += static_cast<acc_t>(src[ow]);
            }
          }
        }
      }
      image_t* dst = images + (image * g.channels + c) * plane + first_ih * g.width;
      for (int64_t i = 0; i < reached; ++i) {
        dst[i] = static_cast<image_t>(static_cast<acc_t>(dst[i]) + sum[i]);
      }
    }
  });
}

void im2col_cpu(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
                IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                const at::Tensor& columns) {
  const ColumnGeometry g = check_columns("torch_convbp.im2col", images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    im2col_kernel(images.const_data_ptr<image_t>(), columns.mutable_data_ptr<column_t>(), g);
  });
}

void col2im_cpu(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
                IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
                const at::Tensor& images) {
  const ColumnGeometry g = check_columns("torch_convbp.col2im", images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    col2im_kernel(columns.const_data_ptr<column_t>(), images.mutable_data_ptr<image_t>(), g);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_convbp, CPU, m) {
  m.impl("im2col", &im2col_cpu);
  m.impl("col2im", &col2im_cpu);
}

}  // namespace torch_convbp

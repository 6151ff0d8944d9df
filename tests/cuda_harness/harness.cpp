// The CPU harness of the CUDA kernels. It runs the per-thread functions of csrc/cuda/*_thread.h,
// which the CUDA kernels are thin loops over, for every (block, thread) of the grid that the
// kernel would be launched with, in 32-bit or 64-bit indices, on CPU tensors. It also exposes the
// launch arithmetic of csrc/cuda/launch.h. tests/test_cuda_threads.py builds it with the host
// compiler and compares its results bitwise with the CPU kernels: no GPU needed.
//
// The operators take the real operators' arguments (checked by the same csrc/checks.cpp), plus
// index_bits, and live in the namespace torch_convbp_cuda_harness.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <vector>

#include "column_types.h"
#include "conv2d.h"
#include "cuda/columns_thread.h"
#include "cuda/depthwise_thread.h"
#include "cuda/grouped_thread.h"
#include "cuda/launch.h"

namespace torch_convbp {
namespace {

// Runs launch(index_t{}) with the index type a test asks for (the launchers choose by size).
template <typename Launch>
void with_index_bits(int64_t index_bits, Launch&& launch) {
  TORCH_CHECK(index_bits == 32 || index_bits == 64, "index_bits must be 32 or 64, got ",
              index_bits);
  if (index_bits == 32) {
    launch(int32_t{0});
  } else {
    launch(int64_t{0});
  }
}

// What a grid-stride kernel over `total` elements, launched with blocks_for(total) blocks of
// kThreads threads, runs: body(i) for every i that every thread takes.
template <typename index_t, typename Body>
void run_grid(int64_t total, Body&& body) {
  const int blocks = blocks_for(total);
  for (int block = 0; block < blocks; ++block) {
    for (int thread = 0; thread < kThreads; ++thread) {
      grid_stride_loop<index_t>(static_cast<index_t>(total), block, thread, blocks, body);
    }
  }
}

// im2col of either layout: the NCHW kernel's threads (one per patch) or the NHWC kernel's (one per
// channel of an output pixel).
template <Layout layout>
void im2col(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
            IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
            int64_t index_bits, const at::Tensor& columns) {
  const ColumnGeometry g = check_columns("harness.im2col", layout, images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  const int64_t total = layout == Layout::nhwc ? im2col_nhwc_threads(g) : im2col_threads(g);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const image_t* src = images.const_data_ptr<image_t>();
    column_t* dst = columns.mutable_data_ptr<column_t>();
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const ColumnDims<index_t> dims(g);
      run_grid<index_t>(total, [&](index_t i) {
        if constexpr (layout == Layout::nhwc) {
          im2col_nhwc_channel(src, dst, dims, i);
        } else {
          im2col_patch(src, dst, dims, i);
        }
      });
    });
  });
}

template <Layout layout>
void col2im(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
            IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
            int64_t index_bits, const at::Tensor& images) {
  const ColumnGeometry g = check_columns("harness.col2im", layout, images, columns, kernel_size,
                                         stride, padding, dilation, row_start, rows);
  const InputRows reached = input_rows_reached(g);
  if (reached.count == 0) return;
  const int64_t total = layout == Layout::nhwc ? col2im_nhwc_threads(g, reached.count)
                                               : col2im_threads(g, reached.count);
  dispatch_column_types(images, columns, [&](auto image_type, auto column_type) {
    using image_t = typename decltype(image_type)::type;
    using column_t = typename decltype(column_type)::type;
    const column_t* src = columns.const_data_ptr<column_t>();
    image_t* dst = images.mutable_data_ptr<image_t>();
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const ColumnDims<index_t> dims(g);
      const auto first = static_cast<index_t>(reached.first);
      const auto count = static_cast<index_t>(reached.count);
      run_grid<index_t>(total, [&](index_t i) {
        if constexpr (layout == Layout::nhwc) {
          col2im_nhwc_channel(src, dst, dims, first, count, i);
        } else {
          col2im_pixel(src, dst, dims, first, count, i);
        }
      });
    });
  });
}

void depthwise_conv2d(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation, int64_t index_bits,
                      const at::Tensor& output) {
  const DepthwiseCall call =
      check_depthwise("harness.depthwise_conv2d", input, weight, output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "harness", [&] {
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const DepthwiseDims<index_t> dims(s, call.channels_last);
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      const scalar_t* w = weight.const_data_ptr<scalar_t>();
      scalar_t* y = output.mutable_data_ptr<scalar_t>();
      run_grid<index_t>(output.numel(), [&](index_t i) { y[i] = depthwise_output(x, w, dims, i); });
    });
  });
}

void depthwise_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t index_bits, const at::Tensor& grad_input) {
  const DepthwiseCall call = check_depthwise("harness.depthwise_input_grad", grad_input, weight,
                                             grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, weight.scalar_type(), "harness", [&] {
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const DepthwiseDims<index_t> dims(s, call.channels_last);
      const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
      const scalar_t* w = weight.const_data_ptr<scalar_t>();
      scalar_t* dx = grad_input.mutable_data_ptr<scalar_t>();
      run_grid<index_t>(grad_input.numel(),
                        [&](index_t i) { dx[i] = depthwise_input_grad_element(dy, w, dims, i); });
    });
  });
}

// The tree sum of one entry's kSumLanes partial sums, level by level, as __syncthreads()
// separates the levels on the GPU.
template <typename acc_t>
acc_t tree_sum(acc_t* partial) {
  for (int half = kSumLanes / 2; half > 0; half /= 2) {
    for (int lane = 0; lane < kSumLanes; ++lane) tree_sum_step(partial, half, lane);
  }
  return partial[0];
}

// The NHWC weight gradient's two kernels, slice by slice: every thread of the lanes kernel's
// grid (slice_lane says which lane it computes and where it leaves it), then the tree sums.
template <typename scalar_t, typename index_t>
void nhwc_weight_grad(const scalar_t* x, const scalar_t* dy, const DepthwiseDims<index_t>& dims,
                      scalar_t* dw) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = dims.kernel_h * dims.kernel_w;
  const int64_t slice = std::min<int64_t>(lane_slice_channels(taps), dims.out_channels);
  std::vector<acc_t> scratch(slice * taps * kSumLanes);
  for (int64_t first = 0; first < dims.out_channels; first += slice) {
    const int64_t channels = std::min<int64_t>(slice, dims.out_channels - first);
    run_grid<index_t>(channels * taps * kSumLanes, [&](index_t t) {
      const auto l = slice_lane(t, index_t(first), index_t(channels), index_t(taps));
      scratch[l.scratch] = depthwise_weight_grad_lane(x, dy, dims, l.entry, l.lane);
    });
    for (int64_t row = 0; row < channels * taps; ++row) {
      dw[first * taps + row] = static_cast<scalar_t>(tree_sum(scratch.data() + row * kSumLanes));
    }
  }
}

// The CUDA kernel's blocks, one weight entry at a time (NCHW); a block's kSumLanes threads are
// run one after another, then the tree.
void depthwise_weight_grad(const at::Tensor& input, const at::Tensor& grad_output,
                           IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                           int64_t index_bits, const at::Tensor& grad_weight) {
  const DepthwiseCall call = check_depthwise("harness.depthwise_weight_grad", input, grad_weight,
                                             grad_output, stride, padding, dilation);
  const ConvShape& s = call.shape;
  const int64_t entries = grad_weight.numel();
  const int blocks = blocks_per_item(entries);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "harness", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const DepthwiseDims<index_t> dims(s, call.channels_last);
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
      scalar_t* dw = grad_weight.mutable_data_ptr<scalar_t>();
      if (call.channels_last) return nhwc_weight_grad(x, dy, dims, dw);
      std::vector<acc_t> partial(kSumLanes);
      for (int block = 0; block < blocks; ++block) {
        for (index_t entry = block; entry < entries; entry += blocks) {
          for (int lane = 0; lane < kSumLanes; ++lane) {
            partial[lane] = depthwise_weight_grad_lane(x, dy, dims, entry, index_t(lane));
          }
          dw[entry] = static_cast<scalar_t>(tree_sum(partial.data()));
        }
      }
    });
  });
}

// The direct grouped kernel: one thread per output element (NHWC).
void grouped_conv2d(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                    IntArrayRef padding, IntArrayRef dilation, int64_t groups, int64_t index_bits,
                    const at::Tensor& output) {
  const ConvShape s = check_grouped("harness.grouped_conv2d", input, weight, output, stride,
                                    padding, dilation, groups);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "harness", [&] {
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const GroupedDims<index_t> dims(s);
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      const scalar_t* w = weight.const_data_ptr<scalar_t>();
      scalar_t* y = output.mutable_data_ptr<scalar_t>();
      run_grid<index_t>(output.numel(), [&](index_t i) { y[i] = grouped_output(x, w, dims, i); });
    });
  });
}

// The direct grouped weight gradient's two kernels, pass by pass: every thread of the partial
// sums' grid, then every thread of the one that adds them to the totals (the last pass writing
// the weight gradient).
void grouped_weight_grad(const at::Tensor& input, const at::Tensor& grad_output, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         int64_t index_bits, const at::Tensor& grad_weight) {
  const ConvShape s = check_grouped("harness.grouped_weight_grad", input, grad_weight, grad_output,
                                    stride, padding, dilation, groups);
  const int64_t entries = grad_weight.numel();
  if (entries == 0) return;
  if (s.batch == 0) {
    grad_weight.zero_();
    return;
  }
  const int64_t pass = images_per_pass(entries, s.batch);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "harness", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    with_index_bits(index_bits, [&](auto tag) {
      using index_t = decltype(tag);
      const GroupedDims<index_t> dims(s);
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
      scalar_t* dw = grad_weight.mutable_data_ptr<scalar_t>();
      std::vector<acc_t> totals(entries, acc_t(0)), partials(pass * entries);
      for (int64_t first = 0; first < s.batch; first += pass) {
        const int64_t images = std::min(pass, s.batch - first);
        run_grid<index_t>(images * entries, [&](index_t t) {
          partials[t] = grouped_weight_grad_image(x, dy, dims, index_t(first + t / entries),
                                                  WeightEntry<index_t>(t % index_t(entries), dims));
        });
        const bool last = first + images == s.batch;
        run_grid<index_t>(entries, [&](index_t e) {
          const acc_t total =
              add_image_partials(totals[e], partials.data(), index_t(images), index_t(entries), e);
          if (last) {
            dw[WeightEntry<index_t>(e, dims).in_weight(dims)] = static_cast<scalar_t>(total);
          } else {
            totals[e] = total;
          }
        });
      }
    });
  });
}

// The indices that thread `thread` of block `block` takes in a grid-stride loop over `total`,
// computed in the index type, as the kernel computes them.
std::vector<int64_t> grid_indices(int64_t total, int64_t blocks, int64_t block, int64_t thread,
                                  int64_t index_bits) {
  std::vector<int64_t> visited;
  with_index_bits(index_bits, [&](auto tag) {
    using index_t = decltype(tag);
    grid_stride_loop<index_t>(static_cast<index_t>(total), static_cast<index_t>(block),
                              static_cast<index_t>(thread), static_cast<index_t>(blocks),
                              [&](index_t i) { visited.push_back(i); });
  });
  return visited;
}

std::vector<int64_t> launch_constants() { return {kThreads, kMaxBlocks, kSumLanes}; }
int64_t blocks_for_op(int64_t work) { return blocks_for(work); }
int64_t blocks_per_item_op(int64_t items) { return blocks_per_item(items); }
bool fits_int32_op(int64_t n) { return fits_int32(n); }

}  // namespace

TORCH_LIBRARY(torch_convbp_cuda_harness, m) {
  m.def(
      "im2col(Tensor images, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
      "int row_start, int rows, int index_bits, Tensor(a!) columns) -> ()",
      &im2col<Layout::nchw>);
  m.def(
      "col2im(Tensor columns, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
      "int row_start, int rows, int index_bits, Tensor(a!) images) -> ()",
      &col2im<Layout::nchw>);
  m.def(
      "im2col_nhwc(Tensor images, int[2] kernel_size, int[2] stride, int[2] padding, "
      "int[2] dilation, int row_start, int rows, int index_bits, Tensor(a!) columns) -> ()",
      &im2col<Layout::nhwc>);
  m.def(
      "col2im_nhwc(Tensor columns, int[2] kernel_size, int[2] stride, int[2] padding, "
      "int[2] dilation, int row_start, int rows, int index_bits, Tensor(a!) images) -> ()",
      &col2im<Layout::nhwc>);
  m.def(
      "depthwise_conv2d(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int index_bits, Tensor(a!) output) -> ()",
      &depthwise_conv2d);
  m.def(
      "depthwise_input_grad(Tensor grad_output, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int index_bits, Tensor(a!) grad_input) -> ()",
      &depthwise_input_grad);
  m.def(
      "depthwise_weight_grad(Tensor input, Tensor grad_output, int[2] stride, int[2] padding, "
      "int[2] dilation, int index_bits, Tensor(a!) grad_weight) -> ()",
      &depthwise_weight_grad);
  m.def(
      "grouped_conv2d(Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, int index_bits, Tensor(a!) output) -> ()",
      &grouped_conv2d);
  m.def(
      "grouped_weight_grad(Tensor input, Tensor grad_output, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, int index_bits, Tensor(a!) grad_weight) -> ()",
      &grouped_weight_grad);
  m.def("images_per_pass(int entries, int batch) -> int", &images_per_pass);
  m.def("grid_indices(int total, int blocks, int block, int thread, int index_bits) -> int[]",
        &grid_indices);
  m.def("launch_constants() -> int[]", &launch_constants);
  m.def("blocks_for(int work) -> int", &blocks_for_op);
  m.def("blocks_per_item(int items) -> int", &blocks_per_item_op);
  m.def("fits_int32(int n) -> bool", &fits_int32_op);
}

}  // namespace torch_convbp

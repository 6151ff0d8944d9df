// The CPU harness of the CUDA kernels. It runs the kernels' launch sequences (csrc/cuda/
// *_launch.h: the checks, thread counts, scratch buffers and passes the GPU runs) with a Launcher
// that runs every (block, thread) of each launched grid on the CPU, in 32-bit or 64-bit indices,
// on CPU tensors. The per-thread work is the host-and-device code of csrc/cuda/*_thread.h. It also
// exposes the launch arithmetic of csrc/cuda/launch.h. tests/test_cuda_threads.py builds it with
// the host compiler and compares its results bitwise with the CPU kernels: no GPU needed.
//
// What it cannot see: the GPU's memory model (the order of a tree level's threads, shared memory,
// barriers), launch failures, and anything the device compiler does differently.
//
// The operators take the real operators' arguments, plus index_bits, and live in the namespace
// torch_convbp_cuda_harness.
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <vector>

#include "cuda/columns_launch.h"
#include "cuda/depthwise_launch.h"
#include "cuda/divisor.h"
#include "cuda/grouped_launch.h"
#include "cuda/launch.h"
#include "summation.h"

namespace torch_convbp {
namespace {

// A Launcher (launch.h) on the CPU, in the index type a test asks for (the CUDA launcher
// chooses it by size, with_index_type).
class GridRunner {
 public:
  explicit GridRunner(int64_t index_bits) : index_bits_(index_bits) {
    TORCH_CHECK(index_bits == 32 || index_bits == 64, "index_bits must be 32 or 64, got ",
                index_bits);
  }

  void use_device(const at::Device&) {}

  template <typename F>
  void with_index(int64_t /*largest*/, F&& f) {
    if (index_bits_ == 32) {
      f(int32_t{0});
    } else {
      f(int64_t{0});
    }
  }

  // What a grid-stride kernel over `total` elements, launched with blocks_for(total) blocks of
  // kThreads threads, runs: body(i) for every i that every thread takes.
  template <typename index_t, typename Body>
  void grid(int64_t total, const Body& body) {
    const int blocks = blocks_for(total);
    for (int block = 0; block < blocks; ++block) {
      for (int thread = 0; thread < kThreads; ++thread) {
        grid_stride_loop<index_t>(static_cast<index_t>(total), block, thread, blocks, body);
      }
    }
  }

  // What the lane-sum kernel runs: each block takes items block, block + blocks, ...; for each,
  // its kSumLanes threads compute their lanes, then the tree's levels run one after another (as
  // the barriers separate them on the GPU), and the total is written.
  template <typename index_t, typename Lane, typename Write>
  void lane_sums(int64_t items, const Lane& lane_of, const Write& write) {
    using acc_t = decltype(lane_of(index_t(0), index_t(0)));
    const int blocks = blocks_per_item(items);
    std::vector<acc_t> partial(kSumLanes);
    for (int block = 0; block < blocks; ++block) {
      for (index_t item = block; item < static_cast<index_t>(items); item += blocks) {
        for (int lane = 0; lane < kSumLanes; ++lane) partial[lane] = lane_of(item, index_t(lane));
        for (int half = kSumLanes / 2; half > 0; half /= 2) {
          for (int lane = 0; lane < kSumLanes; ++lane) tree_sum_step(partial.data(), half, lane);
        }
        write(item, partial[0]);
      }
    }
  }

 private:
  int64_t index_bits_;
};

template <Layout layout>
void im2col(const at::Tensor& images, IntArrayRef kernel_size, IntArrayRef stride,
            IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
            int64_t index_bits, const at::Tensor& columns) {
  GridRunner runner(index_bits);
  launch_im2col<layout>(runner, "harness.im2col", images, kernel_size, stride, padding, dilation,
                        row_start, rows, columns);
}

template <Layout layout>
void col2im(const at::Tensor& columns, IntArrayRef kernel_size, IntArrayRef stride,
            IntArrayRef padding, IntArrayRef dilation, int64_t row_start, int64_t rows,
            int64_t index_bits, const at::Tensor& images) {
  GridRunner runner(index_bits);
  launch_col2im<layout>(runner, "harness.col2im", columns, kernel_size, stride, padding, dilation,
                        row_start, rows, images);
}

void depthwise_conv2d(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation, int64_t index_bits,
                      const at::Tensor& output) {
  GridRunner runner(index_bits);
  launch_depthwise_forward(runner, "harness.depthwise_conv2d", input, weight, stride, padding,
                           dilation, output);
}

void depthwise_input_grad(const at::Tensor& grad_output, const at::Tensor& weight,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          int64_t index_bits, const at::Tensor& grad_input) {
  GridRunner runner(index_bits);
  launch_depthwise_input_grad(runner, "harness.depthwise_input_grad", grad_output, weight, stride,
                              padding, dilation, grad_input);
}

void depthwise_weight_grad(const at::Tensor& input, const at::Tensor& grad_output,
                           IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                           int64_t index_bits, const at::Tensor& grad_weight) {
  GridRunner runner(index_bits);
  launch_depthwise_weight_grad(runner, "harness.depthwise_weight_grad", input, grad_output, stride,
                               padding, dilation, grad_weight);
}

void grouped_conv2d(const at::Tensor& input, const at::Tensor& weight, IntArrayRef stride,
                    IntArrayRef padding, IntArrayRef dilation, int64_t groups, int64_t index_bits,
                    const at::Tensor& output) {
  GridRunner runner(index_bits);
  launch_grouped_forward(runner, "harness.grouped_conv2d", input, weight, stride, padding, dilation,
                         groups, output);
}

void grouped_weight_grad(const at::Tensor& input, const at::Tensor& grad_output, IntArrayRef stride,
                         IntArrayRef padding, IntArrayRef dilation, int64_t groups,
                         int64_t index_bits, const at::Tensor& grad_weight) {
  GridRunner runner(index_bits);
  launch_grouped_weight_grad(runner, "harness.grouped_weight_grad", input, grad_output, stride,
                             padding, dilation, groups, grad_weight);
}

// The indices that thread `thread` of block `block` takes in a grid-stride loop over `total`,
// computed in the index type, as the kernel computes them.
std::vector<int64_t> grid_indices(int64_t total, int64_t blocks, int64_t block, int64_t thread,
                                  int64_t index_bits) {
  std::vector<int64_t> visited;
  GridRunner(index_bits).with_index(0, [&](auto tag) {
    using index_t = decltype(tag);
    grid_stride_loop<index_t>(static_cast<index_t>(total), static_cast<index_t>(block),
                              static_cast<index_t>(thread), static_cast<index_t>(blocks),
                              [&](index_t i) { visited.push_back(i); });
  });
  return visited;
}

// n / divisor for each n of an int32 tensor, by the kernels' Divisor<int32_t> (divisor.h).
at::Tensor divisor_quotients(const at::Tensor& numerators, int64_t divisor) {
  TORCH_CHECK(numerators.scalar_type() == at::kInt && numerators.is_contiguous(),
              "numerators must be a contiguous int32 tensor");
  TORCH_CHECK(divisor >= 1 && divisor <= INT32_MAX, "divisor must be in [1, 2^31), got ", divisor);
  const Divisor<int32_t> d(static_cast<int32_t>(divisor));
  at::Tensor quotients = at::empty_like(numerators);
  const int32_t* n = numerators.const_data_ptr<int32_t>();
  int32_t* q = quotients.mutable_data_ptr<int32_t>();
  for (int64_t i = 0; i < numerators.numel(); ++i) q[i] = d.quotient(n[i]);
  return quotients;
}

std::vector<int64_t> launch_constants() { return {kThreads, kMaxBlocks, kSumLanes}; }
int64_t blocks_for_op(int64_t work) { return blocks_for(work); }
int64_t blocks_per_item_op(int64_t items) { return blocks_per_item(items); }
bool fits_int32_op(int64_t n) { return fits_int32(n); }

}  // namespace

TORCH_LIBRARY(torch_convbp_cuda_harness, m) {
  m.def(
      "im2col(Tensor images, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
      "int row_start, int rows, int index_bits, Tensor(a!) columns) -> ()",
      &im2col<Layout::nchw>);
  m.def(
      "col2im(Tensor columns, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
      "int row_start, int rows, int index_bits, Tensor(a!) images) -> ()",
      &col2im<Layout::nchw>);
  m.def(
      "im2col_nhwc(Tensor images, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, int index_bits, Tensor(a!) columns) -> ()",
      &im2col<Layout::nhwc>);
  m.def(
      "col2im_nhwc(Tensor columns, int[] kernel_size, int[] stride, int[] padding, "
      "int[] dilation, int row_start, int rows, int index_bits, Tensor(a!) images) -> ()",
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
  m.def("divisor_quotients(Tensor numerators, int divisor) -> Tensor", &divisor_quotients);
  m.def("blocks_for(int work) -> int", &blocks_for_op);
  m.def("blocks_per_item(int items) -> int", &blocks_per_item_op);
  m.def("fits_int32(int n) -> bool", &fits_int32_op);
}

}  // namespace torch_convbp

// The CPU's depthwise weight gradient in the order of rows (summation.h, DepthwiseOrder::rows),
// as both layouts' kernels sum it (depthwise_rows_cpu.cpp, NHWC; depthwise_rows_nchw_cpu.cpp,
// NCHW): weight entry (o, ki, kj) is
//   the sum over the groups of output rows, in order, of
//     the sum over the group's rows (n, oh), in order, of
//       the sum over ow, in increasing order, of dy(n, o, oh, ow) * x(n, o / m, ih, iw)
// where (ih, iw) is what tap (ki, kj) reads from output pixel (oh, ow), taps in the padding
// skipped; every sum starts from zero, each product is added by one multiply_add, and the groups
// of rows are fixed by the number of rows (kRowGroups), never by the thread count. A row whose
// tap reads a padding row adds its zero sum all the same.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../shape.h"

namespace torch_convbp {

// The weight gradient in the order of rows from NCHW float32 operands, as they are
// (depthwise_rows_nchw_cpu.cpp; cpu_rows_take_nchw says where): bitwise the NHWC kernel's.
void depthwise_nchw_weight_grad_rows(const at::Tensor& input, const at::Tensor& grad_output,
                                     const ConvShape& s, const at::Tensor& grad_weight);

// Groups of output rows, whose sums are added in order at the end: the pieces of work for the
// threads (each task a group, all channels), and a count fixed by the number of rows.
constexpr int64_t kRowGroups = 16;

// The weight gradient [Cout, taps] from the groups' sums: add_rows(first_row, end_row, totals)
// adds the sums of the rows [first_row, end_row) of N * OH, in order, into totals [taps][Cout]
// (zeros at first), a group per task; the groups' totals are then added in order.
template <typename acc_t, typename scalar_t, typename AddRows>
void weight_grad_in_row_groups(const ConvShape& s, scalar_t* grad_weight, AddRows&& add_rows) {
  const int64_t taps = s.kernel_h * s.kernel_w, cout = s.out_channels;
  const int64_t rows = s.batch * s.out_height;
  const int64_t per_group = (rows + kRowGroups - 1) / kRowGroups;
  const int64_t groups = rows == 0 ? 0 : (rows + per_group - 1) / per_group;
  std::vector<acc_t> group_sums(groups * taps * cout, acc_t(0));  // [groups][taps][Cout]
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      add_rows(g * per_group, std::min(rows, (g + 1) * per_group),
               group_sums.data() + g * taps * cout);
    }
  });
  for (int64_t o = 0; o < cout; ++o) {
    for (int64_t t = 0; t < taps; ++t) {
      acc_t total = 0;
      for (int64_t g = 0; g < groups; ++g) total = total + group_sums[(g * taps + t) * cout + o];
      grad_weight[o * taps + t] = static_cast<scalar_t>(total);
    }
  }
}

}  // namespace torch_convbp

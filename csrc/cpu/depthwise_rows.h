// The CPU's depthwise weight gradient in the order of rows (summation.h, DepthwiseOrder::rows),
// computed in depthwise_rows_cpu.cpp: weight entry (o, ki, kj) is
//   the sum over the groups of output rows, in order, of
//     the sum over the group's rows (n, oh), in order, of
//       the sum over ow, in increasing order, of dy(n, o, oh, ow) * x(n, o / m, ih, iw)
// where (ih, iw) is what tap (ki, kj) reads from output pixel (oh, ow), taps in the padding
// skipped; every sum starts from zero, each product is added by one multiply_add, and the groups
// of rows are fixed by the number of rows (kRowGroups), never by the thread count. A row whose
// tap reads a padding row adds its zero sum all the same.
#pragma once

#include <ATen/core/Tensor.h>

#include "../shape.h"

namespace torch_convbp {

// The weight gradient in the order of rows, the CPU's default (cpu_depthwise_order()): not the
// CUDA kernels' bits, the same on any thread count; with the arguments checked by check_depthwise,
// from operands in `layout` (depthwise_rows_cpu.cpp: vectors of channels; NCHW operands a band
// of rows at a time transposed in cache). The same bits from either layout.
void depthwise_weight_grad_rows(const at::Tensor& input, const at::Tensor& grad_output,
                                const ConvShape& s, const at::Tensor& grad_weight, Layout layout);

}  // namespace torch_convbp

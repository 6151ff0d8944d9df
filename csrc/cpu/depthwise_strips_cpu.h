// The depthwise 3x3 kernels of stride 1 on a row's inner pixels (depthwise_strips_cpu.cpp), which
// the NHWC forward and input gradient (depthwise_nhwc_cpu.cpp) run first on each row, leaving the
// row's other pixels to their general kernels. The same bits as those.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "../shape.h"
#include "cpu_kernels.h"

namespace torch_convbp {

enum class StripPass { forward, input_grad };

// Result row `row` of a pass (an output row of the forward; an input row of the input gradient,
// read from dY) over `source` (one image, NHWC, float32), its pixels from columns.begin on in
// whole strips, within `columns` (inner: every kernel column's tap inside the source row), every
// channel, into `result` (that row, NHWC). `w_by_tap`: the weight as [9, C]. Returns where the
// strips end: columns.begin unless the CPU runs AVX-512 kernels (vector_ops.h), `s` is 2-D with
// a 3x3 kernel, stride 1, no dilation and one output channel per input channel, and 16 divides C.
int64_t depthwise_strips(StripPass pass, const float* source, const float* w_by_tap, int64_t row,
                         Span columns, float* result, const ConvShape& s);
// The same on bfloat16 rows, read and written as they are: the float32 sums of rows widened
// beforehand, each rounded to bfloat16 as round_to_bfloat16 rounds (bfloat16_cpu.h).
int64_t depthwise_strips(StripPass pass, const c10::BFloat16* source, const float* w_by_tap,
                         int64_t row, Span columns, c10::BFloat16* result, const ConvShape& s);

// The pixels [columns.begin, end) that depthwise_strips computes within `columns`, before it runs
// ({0, 0} where it computes none), so that a caller knows which source columns the rest reads.
Span strip_pixels(const ConvShape& s, Span columns);

}  // namespace torch_convbp

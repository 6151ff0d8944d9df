// bfloat16 results written from float32 sums, in vector instructions.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torch_convbp {

// to[i] = from[i] rounded to bfloat16, i < n: the bits of c10::BFloat16(from[i]) (to nearest
// even; a NaN becomes 0x7FC0), computed on 16 or 8 floats at a time. c10's conversion is
// scalar, and in a loop of it GCC vectorized only by SSE lanes: rounding the output took more
// time than the GEMM (benchmarks/NOTES.md, section 53).
void round_to_bfloat16(const float* from, int64_t n, c10::BFloat16* to);

}  // namespace torch_convbp

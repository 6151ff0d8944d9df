// bfloat16 converted to and from float32, in vector instructions.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torch_convbp {

// to[i] = from[i] rounded to bfloat16, i < n: the bits of c10::BFloat16(from[i]) (to nearest
// even; a NaN becomes 0x7FC0), computed on 16 or 8 floats at a time. c10's conversion is
// scalar, and in a loop of it GCC vectorized only by SSE lanes: rounding the output took more
// time than the GEMM (benchmarks/NOTES.md, section 53).
void round_to_bfloat16(const float* from, int64_t n, c10::BFloat16* to);

// to[i] = from[i] as float (exact: the bits as the float's upper half), i < n, 16 or 8 at a
// time: a loop of c10's conversion stayed scalar (benchmarks/NOTES.md, section 97).
void widen_bfloat16(const c10::BFloat16* from, int64_t n, float* to);

}  // namespace torch_convbp

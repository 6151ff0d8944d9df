// The dtype the GEMMs run in (gemm_dtype.cpp).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace torch_convbp {

// The dtype the GEMMs run in for operands of `dtype` on `device`: the operands' own, or float32
// for float16 and bfloat16 on the CPU (the column matrices and staging are then float32, and each
// result is rounded once).
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device);

}  // namespace torch_convbp

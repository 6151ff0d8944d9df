// The dtype the GEMMs run in (gemm_dtype.cpp), and whether this CPU multiplies half-precision
// matrices with instructions of its own (cpu/half_gemm.cpp).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace torch_convbp {

// The dtype the GEMMs run in for operands of `dtype` on `device`: the operands' own, or float32
// for float16 and bfloat16 on a CPU that would emulate half-precision GEMMs (the column matrices
// and staging are then float32, and each result is rounded once).
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device);

// Whether this CPU multiplies float16 (bfloat16) matrices natively, with AVX512-FP16 (BF16) or
// AMX, rather than by a slow emulation; true for other dtypes.
bool cpu_has_native_half_gemm(at::ScalarType dtype);

}  // namespace torch_convbp

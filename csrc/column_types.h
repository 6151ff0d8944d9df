// The element types of the im2col and col2im kernels, for every device.
//
// The column matrix has the images' dtype, or float32 for float16 and bfloat16 images when the
// GEMMs run in float32 (see gemm_dtype in conv2d.cpp): im2col then converts as it copies, and
// col2im as it adds (col2im sums in float32 for these types anyway).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include <type_traits>

namespace torch_convbp {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls body(TypeTag<image_t>{}, TypeTag<column_t>{}) with the element types of images and
// columns (a pair that check_columns has accepted).
template <class Body>
void dispatch_column_types(const at::Tensor& images, const at::Tensor& columns, Body&& body) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, images.scalar_type(), "columns", [&] {
    if constexpr (std::is_same_v<scalar_t, at::Half> || std::is_same_v<scalar_t, at::BFloat16>) {
      if (columns.scalar_type() == at::kFloat) {
        body(TypeTag<scalar_t>{}, TypeTag<float>{});
        return;
      }
    }
    body(TypeTag<scalar_t>{}, TypeTag<scalar_t>{});
  });
}

}  // namespace torch_convbp

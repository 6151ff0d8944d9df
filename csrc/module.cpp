// The Python module torch_convbp._C: loading it registers the operators; it also carries the
// operators' direct calls for eager code, the workspace limit, which is process-wide state rather
// than an operator, the choice of route for torch_convbp.explain(), and the torch version it was
// compiled against (torch has no stable C++ ABI: __init__.py refuses another version).
#include <torch/python.h>
#include <torch/version.h>

#include <string>
#include <tuple>
#include <vector>

#include "blas_gemm.h"
#include "checks.h"
#include "cpu_features.h"
#include "gemm_choice.h"
#include "microkernel_gemm.h"
#include "operators.h"
#include "plan.h"
#include "route.h"
#include "scratch.h"
#include "volume_planes.h"

namespace {

// The route that operator `op` ("forward", "input_grad" or "weight_grad") takes for a
// convolution of these sizes and arguments, given its activation operands (route.h):
// (route, layout, reason).
std::tuple<std::string, std::string, std::string> route(
    const std::string& op, std::vector<int64_t> input_size, std::vector<int64_t> weight_size,
    std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
    int64_t groups, const std::vector<at::Tensor>& activations) {
  using torch_convbp::Operator;
  const Operator which = op == "forward"      ? Operator::forward
                         : op == "input_grad" ? Operator::input_grad
                                              : Operator::weight_grad;
  TORCH_CHECK(op == "forward" || op == "input_grad" || op == "weight_grad",
              "torch_convbp: the operator must be forward, input_grad or weight_grad, got '", op,
              "'");
  TORCH_CHECK(activations.size() == (which == Operator::weight_grad ? 2u : 1u),
              "torch_convbp: the ", op, " operator has ", which == Operator::weight_grad ? 2 : 1,
              " activation operands, got ", activations.size());
  const auto s = torch_convbp::check_convolution(
      "torch_convbp.explain", static_cast<int64_t>(input_size.size()) - 2, input_size, weight_size,
      stride, padding, dilation, groups);
  if (const auto form = torch_convbp::planar_form(s, activations)) {  // the 2-D convolution's route
    const auto a = torch_convbp::planar_arguments(*form, s);
    std::vector<at::Tensor> planes;
    for (const at::Tensor& t : activations) {
      planes.push_back(torch_convbp::activation_as_planes(t, *form));
    }
    auto [name, layout, why] =
        route(op, torch_convbp::size_as_planes(input_size, *form),
              torch_convbp::weight_size_as_planes(weight_size, *form),
              {a.stride.begin(), a.stride.end()}, {a.padding.begin(), a.padding.end()},
              {a.dilation.begin(), a.dilation.end()}, groups, planes);
    return {name, layout, torch_convbp::planar_form_why(*form) + std::string("(") + why + ")"};
  }
  const auto choice = torch_convbp::choose_route(which, s, activations);
  return {torch_convbp::route_name(choice.route), torch_convbp::layout_name(choice.layout),
          std::string(choice.why_route) + "; " + choice.why_layout};
}

// out (+)= a @ b on the micro-kernel driver alone, for its tests: CPU tensors [G, M, K] @ [G, K, N]
// -> [G, M, N], any strides; float32, or bfloat16 operands (where the CPU computes them) into a
// float32 or bfloat16 result.
void microkernel_gemm_checked(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                              bool accumulate) {
  constexpr const char* op = "torch_convbp._C._microkernel_gemm";
  for (const at::Tensor* t : {&out, &a, &b}) {
    TORCH_CHECK(t->dim() == 3 && t->device().is_cpu() &&
                    (t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16),
                op, ": expected 3-D float32 or bfloat16 CPU tensors, got ", t->sizes(), " ",
                t->scalar_type(), " on ", t->device());
  }
  TORCH_CHECK(a.scalar_type() == b.scalar_type() &&
                  (out.scalar_type() == a.scalar_type() || out.scalar_type() == at::kFloat),
              op, ": expected operands of one dtype and a result in it or in float32, got ",
              a.scalar_type(), " @ ", b.scalar_type(), " into ", out.scalar_type());
  TORCH_CHECK(a.scalar_type() == at::kFloat || torch_convbp::cpu_has_bfloat16_microkernel(), op,
              ": this CPU (or torch) has no bfloat16 micro-kernel");
  TORCH_CHECK(a.size(0) == out.size(0) && b.size(0) == out.size(0) && a.size(1) == out.size(1) &&
                  b.size(2) == out.size(2) && a.size(2) == b.size(1),
              op, ": cannot multiply ", a.sizes(), " by ", b.sizes(), " into ", out.sizes());
  torch_convbp::microkernel_gemm(out, a, b, accumulate);
}

// out (+)= a @ b on BLAS without at::addmm_ (blas_gemm.h), for its tests: CPU tensors [1, M, K] @
// [1, K, N] -> [1, M, N]; false where blas_gemm leaves the product to at::addmm_.
bool blas_gemm_checked(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                       bool accumulate) {
  TORCH_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3 && a.size(0) == out.size(0) &&
                  b.size(0) == out.size(0) && a.size(1) == out.size(1) &&
                  b.size(2) == out.size(2) && a.size(2) == b.size(1),
              "torch_convbp._C._blas_gemm: cannot multiply ", a.sizes(), " by ", b.sizes(),
              " into ", out.sizes());
  return torch_convbp::blas_gemm(out, a, b, accumulate);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_convbp: im2col + GEMM 2-D convolution operators (torch.ops.torch_convbp)";
  // The operators that torch_convbp.functional calls, called through the dispatcher as torch.ops
  // calls them, with the same arguments, but without the torch.ops packet's matching of the
  // arguments against the schema and their boxing: host time that a small layer waits for
  // (benchmarks/NOTES.md, section 90). The Python functions call torch.ops where torch.compile
  // traces them and where an operand has __torch_function__ (functional.py, _operators).
  // Positional arguments, as functional.py passes them, in the operators' schema order.
  for (const auto& [name, forward] : {std::pair{"conv2d", &torch_convbp::call_forward<2>},
                                      std::pair{"conv3d", &torch_convbp::call_forward<3>}}) {
    m.def(name, forward, py::call_guard<py::gil_scoped_release>(),
          "torch.ops.torch_convbp's operator, called directly.");
  }
  for (const auto& [name, input_grad] :
       {std::pair{"conv2d_input_grad", &torch_convbp::call_input_grad<2>},
        std::pair{"conv3d_input_grad", &torch_convbp::call_input_grad<3>}}) {
    m.def(name, input_grad, py::call_guard<py::gil_scoped_release>(),
          "torch.ops.torch_convbp's operator, called directly.");
  }
  m.def("set_workspace_limit", &torch_convbp::set_workspace_limit, py::arg("nbytes"),
        "Largest column buffer (plus staging) one call may allocate, in bytes.");
  m.def("workspace_limit", &torch_convbp::workspace_limit, "The workspace limit in bytes.");
  m.def("workspace_peak", &torch_convbp::workspace_peak, py::arg("reset") = false,
        "The most workspace held at once since the last reset, in bytes.");
  m.def("release_scratch", &torch_convbp::release_scratch,
        "Frees the CPU scratch memory kept between calls; returns the bytes freed.");
  m.def("pooled_scratch", &torch_convbp::pooled_scratch_bytes,
        "The bytes of CPU scratch memory kept between calls, not in use.");
  m.def(
      "gemm_dtype",
      [](at::ScalarType dtype, const at::Device& device) {
        return torch_convbp::gemm_dtype(dtype, device);
      },
      py::arg("dtype"), py::arg("device"),
      "The dtype the GEMMs run in for operands of this dtype on this device.");
  m.def(
      "gemm_engine",
      [](at::ScalarType dtype, const at::Device& device, int64_t rows, int64_t cols) {
        const auto compute = torch_convbp::gemm_dtype(dtype, device);
        const auto engine = rows < 0 ? torch_convbp::gemm_engine(compute, device)
                                     : torch_convbp::gemm_engine(compute, device, rows, cols);
        return std::string(torch_convbp::gemm_engine_name(engine));
      },
      py::arg("dtype"), py::arg("device"), py::arg("rows") = -1, py::arg("cols") = -1,
      "What runs the GEMMs for operands of this dtype on this device, or the GEMM of a rows x "
      "cols result (rows >= 0): 'aten' or 'microkernel'.");
  m.def("_microkernel_gemm", &microkernel_gemm_checked, py::arg("out"), py::arg("a"), py::arg("b"),
        py::arg("accumulate"), "out (+)= a @ b on the micro-kernel GEMM driver, for its tests.");
  m.def("_blas_gemm", &blas_gemm_checked, py::arg("out"), py::arg("a"), py::arg("b"),
        py::arg("accumulate"),
        "out (+)= a @ b on BLAS without at::addmm_, for its tests: [1, M, K] @ [1, K, N]; "
        "False where it leaves the product to at::addmm_.");
  m.def("_cpu_allows_avx512_kernels", &torch_convbp::cpu_allows_avx512_kernels,
        "Whether the CPU rules that ask for AVX-512 kernels hold here (cpu_features.h), for the "
        "tests.");
  m.def("_route", &route, py::arg("op"), py::arg("input_size"), py::arg("weight_size"),
        py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"),
        py::arg("activations"),
        "(route, layout, reason) of one operator for a convolution and its activation operands.");
  // From torch/version.h (included above: without it these names do not compile).
  m.attr("built_with_torch") = std::to_string(TORCH_VERSION_MAJOR) + "." +
                               std::to_string(TORCH_VERSION_MINOR) + "." +
                               std::to_string(TORCH_VERSION_PATCH);
  // The CUDA architectures the kernels were compiled for (setup.py: sm_80+compute_90+...), empty
  // without CUDA kernels.
#if defined(TORCH_CONVBP_CUDA_ARCHS)
#define TORCH_CONVBP_STRING(x) #x
#define TORCH_CONVBP_EXPANDED_STRING(x) TORCH_CONVBP_STRING(x)
  m.attr("built_for_cuda_archs") = TORCH_CONVBP_EXPANDED_STRING(TORCH_CONVBP_CUDA_ARCHS);
#else
  m.attr("built_for_cuda_archs") = "";
#endif
}

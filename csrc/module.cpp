// The Python module torch_convbp._C: loading it registers the operators; it also carries the
// workspace limit, which is process-wide state rather than an operator, and the torch version it
// was compiled against (torch has no stable C++ ABI: __init__.py refuses another version).
#include <torch/extension.h>

#include <string>

#include "conv2d.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_convbp: im2col + GEMM 2-D convolution operators (torch.ops.torch_convbp)";
  m.def("set_workspace_limit", &torch_convbp::set_workspace_limit, py::arg("nbytes"),
        "Largest column buffer (plus staging) one call may allocate, in bytes.");
  m.def("workspace_limit", &torch_convbp::workspace_limit, "The workspace limit in bytes.");
  m.def("workspace_peak", &torch_convbp::workspace_peak, py::arg("reset") = false,
        "The most workspace held at once since the last reset, in bytes.");
  m.def("gemm_dtype", &torch_convbp::gemm_dtype, py::arg("dtype"), py::arg("device"),
        "The dtype the GEMMs run in for operands of this dtype on this device.");
#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR) && defined(TORCH_VERSION_PATCH)
  m.attr("built_with_torch") = std::to_string(TORCH_VERSION_MAJOR) + "." +
                               std::to_string(TORCH_VERSION_MINOR) + "." +
                               std::to_string(TORCH_VERSION_PATCH);
#else
  m.attr("built_with_torch") = py::none();
#endif
}

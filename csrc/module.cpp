// The Python module torch_convbp._C: loading it registers the operators; it also carries the
// workspace limit, which is process-wide state rather than an operator.
#include <torch/extension.h>

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
}

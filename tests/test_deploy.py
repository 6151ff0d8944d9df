"""A converted model leaves PyTorch: torch.export (static and dynamic batch), AOTInductor, and
ONNX through torch_convbp.onnx_translation_table(), run by onnxruntime."""
import sys

import pytest
import torch

import torch_convbp
from test_family_modules import EveryClass

F32 = dict(dtype=torch.float32)


def converted_model():
    torch.manual_seed(0)
    return torch_convbp.convert(EveryClass()).eval()


def example_inputs(batch):
    return EveryClass.inputs(batch)


def dynamic_batch():
    batch = torch.export.Dim("batch", min=1, max=64)
    return ({0: batch}, {0: batch}, {0: batch})


def assert_outputs_close(actual, expected):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(torch.as_tensor(a), e, rtol=1e-5, atol=1e-5)


def our_operators(graph_module):
    return {str(n.target) for n in graph_module.graph.nodes if "torch_convbp" in str(n.target)}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static-batch", "dynamic-batch"])
def test_torch_export(dynamic):
    model = converted_model()
    program = torch.export.export(model, example_inputs(2), dynamic_shapes=dynamic_batch() if dynamic else None)
    assert our_operators(program.graph_module) == {
        f"torch_convbp.{name}.default" for name in ("conv2d", "conv2d_input_grad", "conv3d", "conv3d_input_grad")}
    for batch in (2, 5) if dynamic else (2,):
        with torch.no_grad():
            assert_outputs_close(program.module()(*example_inputs(batch)), model(*example_inputs(batch)))


def test_aot_inductor(tmp_path):
    """Compiled ahead of time to a package; our operators are called through the dispatcher, so
    the loading process imports torch_convbp first."""
    model = converted_model()
    program = torch.export.export(model, example_inputs(2), dynamic_shapes=dynamic_batch())
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "model.pt2"))
    loaded = torch._inductor.aoti_load_package(path)
    for batch in (2, 3):
        with torch.no_grad():
            assert_outputs_close(loaded(*example_inputs(batch)), model(*example_inputs(batch)))


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the optional extra torch_convbp[onnx]")
    pytest.importorskip("onnxscript", reason="the optional extra torch_convbp[onnx]")
    ort = pytest.importorskip("onnxruntime", reason="the optional extra torch_convbp[onnx]")
    model = converted_model()
    program = torch.onnx.export(model, example_inputs(2), dynamo=True, dynamic_shapes=dynamic_batch(),
                                custom_translation_table=torch_convbp.onnx_translation_table())
    path = tmp_path / "model.onnx"
    program.save(str(path))
    saved = onnx.load(str(path))
    op_types = {node.op_type for node in saved.graph.node}
    assert {"Conv", "ConvTranspose"} <= op_types
    assert {node.domain for node in saved.graph.node} <= {"", "ai.onnx"}  # standard operators only
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (2, 7):
        inputs = example_inputs(batch)
        feeds = {arg.name: t.numpy() for arg, t in zip(session.get_inputs(), inputs)}
        with torch.no_grad():
            assert_outputs_close(session.run(None, feeds), model(*inputs))


def test_onnx_translation_without_the_extra_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'torch_convbp\[onnx\]'"):
        torch_convbp.onnx_translation_table()

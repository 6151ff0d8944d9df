"""ONNX export: the operators as the standard ONNX Conv and ConvTranspose.

    onnx_program = torch.onnx.export(model, args, dynamo=True,
                                     custom_translation_table=torch_convbp.onnx_translation_table())

onnx and onnxscript (and onnxruntime to run the file) are an optional extra,
`pip install torch_convbp[onnx]`, imported only here.
"""


def _onnx_opset():
    try:
        import onnx  # noqa: F401  (torch.onnx needs it too)
        from onnxscript import opset18
    except ImportError as error:
        raise ImportError(
            "torch_convbp.onnx_translation_table() needs onnx and onnxscript (and onnxruntime to run the "
            f"exported file): pip install 'torch_convbp[onnx]' or pip install onnx onnxscript onnxruntime ({error})"
        ) from error
    return opset18


def onnx_translation_table() -> dict:
    """{operator: onnxscript function} for torch.onnx.export(..., dynamo=True,
    custom_translation_table=...): conv2d and conv3d become Conv, conv2d_input_grad and
    conv3d_input_grad (a transposed convolution, or a convolution's input gradient) ConvTranspose,
    with the strides, pads, dilations, group and output padding of the call. The weight gradients
    appear only in graphs of a backward pass and have no ONNX counterpart."""
    import torch

    op = _onnx_opset()
    ops = torch.ops.torch_convbp

    def convolution(input, weight, bias, stride, padding, dilation, groups):
        operands = (input, weight) if bias is None else (input, weight, bias)
        return op.Conv(*operands, strides=list(stride), pads=[*padding, *padding], dilations=list(dilation), group=groups)

    def input_grad(grad_output, weight, input_size, stride, padding, dilation, groups):
        # ConvTranspose's output is (in - 1)·stride - 2·pad + dilation·(k - 1) + 1 + output_padding;
        # output_padding is what makes it input_size.
        output_padding = [
            input_size[2 + i]
            - ((grad_output.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1) + 1)
            for i in range(len(stride))
        ]
        return op.ConvTranspose(
            grad_output, weight, strides=list(stride), pads=[*padding, *padding], dilations=list(dilation),
            group=groups, output_padding=output_padding,
        )

    return {
        ops.conv2d.default: convolution,
        ops.conv2d_input_grad.default: input_grad,
        ops.conv3d.default: convolution,
        ops.conv3d_input_grad.default: input_grad,
    }

"""torch_convbp.Conv2d, a drop-in nn.Conv2d, and convert() for whole models."""
import torch.nn as nn
import torch.nn.functional as F

from .functional import conv2d


class Conv2d(nn.Conv2d):
    """nn.Conv2d computed by torch_convbp: the same constructor, parameters and state_dict
    (load_state_dict works both ways), every padding_mode."""

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv2d(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert(model: nn.Module) -> nn.Module:
    """Makes every nn.Conv2d in `model` (the model itself included) a torch_convbp.Conv2d, in place,
    and returns the model. The modules keep their parameters (the same Parameter objects, so an
    optimizer built before still works), buffers, hooks and training mode: only their class
    changes, since torch_convbp.Conv2d adds no state. Subclasses of nn.Conv2d are left alone."""
    for module in model.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = Conv2d
    return model

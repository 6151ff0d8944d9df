"""Drop-in modules for the nn convolution family, and convert() / revert() for whole models.

Each is a subclass of its nn class that adds no state: the same constructor, parameters and
state_dict (load_state_dict works both ways), every padding_mode nn supports for it, and for the
transposed ones the output_size argument of forward. So convert() and revert() only change the
class of a module, in place, and keep its Parameter objects (an optimizer built before keeps
working), buffers, hooks and training mode.
"""
import torch.nn as nn
import torch.nn.functional as F

from .functional import conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d


class _Convolution:
    """_conv_forward of nn.Conv1d / Conv2d / Conv3d, computed by `function`."""

    function = None

    def _conv_forward(self, input, weight, bias):
        convolve = type(self).function
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return convolve(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return convolve(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


class _TransposedConvolution:
    """forward of nn.ConvTranspose1d / ConvTranspose2d / ConvTranspose3d, computed by `function`."""

    function = None
    spatial_dims = None

    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":  # nn's own check (its constructor refuses the others)
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        # nn's own rule for output_size, and its error for a size no output_padding reaches.
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, self.spatial_dims, self.dilation
        )
        return type(self).function(
            input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
        )


class Conv1d(_Convolution, nn.Conv1d):
    """nn.Conv1d computed by torch_convbp."""

    function = staticmethod(conv1d)


class Conv2d(_Convolution, nn.Conv2d):
    """nn.Conv2d computed by torch_convbp."""

    function = staticmethod(conv2d)


class Conv3d(_Convolution, nn.Conv3d):
    """nn.Conv3d computed by torch_convbp."""

    function = staticmethod(conv3d)


class ConvTranspose1d(_TransposedConvolution, nn.ConvTranspose1d):
    """nn.ConvTranspose1d computed by torch_convbp."""

    function = staticmethod(conv_transpose1d)
    spatial_dims = 1


class ConvTranspose2d(_TransposedConvolution, nn.ConvTranspose2d):
    """nn.ConvTranspose2d computed by torch_convbp."""

    function = staticmethod(conv_transpose2d)
    spatial_dims = 2


class ConvTranspose3d(_TransposedConvolution, nn.ConvTranspose3d):
    """nn.ConvTranspose3d computed by torch_convbp."""

    function = staticmethod(conv_transpose3d)
    spatial_dims = 3


_CONVERTED = {
    nn.Conv1d: Conv1d,
    nn.Conv2d: Conv2d,
    nn.Conv3d: Conv3d,
    nn.ConvTranspose1d: ConvTranspose1d,
    nn.ConvTranspose2d: ConvTranspose2d,
    nn.ConvTranspose3d: ConvTranspose3d,
}
_REVERTED = {ours: stock for stock, ours in _CONVERTED.items()}

# Subclasses of the six nn classes that keep nn's computation, and their twins (None where a
# subclass computes something else): made on first use, once per subclass.
_SUBCLASS_TWINS = {}


def _keeps_nn_computation(cls, stock):
    """Whether `cls`, a subclass of nn class `stock`, computes what `stock` does: it overrides
    neither forward nor _conv_forward (torchvision's Conv3DSimple, Conv2Plus1D's parts, say)."""
    return all(getattr(cls, name, None) is getattr(stock, name, None) for name in ("forward", "_conv_forward"))


def _rebuild_twin(subclass, state):
    """Unpickles (and deep-copies) a converted subclass: the subclass's module, then its twin."""
    module = subclass.__new__(subclass)
    module.__setstate__(state)
    module.__class__ = _twin_of(subclass)
    return module


def _reduce_twin(self, protocol):
    # The twin is made at run time, so pickle cannot find it by name: rebuild it from the
    # subclass, which it can.
    return _rebuild_twin, (type(self).stock_class, self.__getstate__())


def _twin_of(cls):
    """torch_convbp's class for a module of class `cls`: ours for nn's six; for a subclass of
    them that keeps nn's computation, a class of its name whose bases are ours and the subclass
    (ours first: our forward, the subclass's other methods; isinstance of both holds); else None."""
    if cls in _CONVERTED:
        return _CONVERTED[cls]
    if cls not in _SUBCLASS_TWINS:
        stock = next((nn_class for nn_class in _CONVERTED if issubclass(cls, nn_class)), None)
        twin = None
        if stock is not None and _keeps_nn_computation(cls, stock):
            twin = type(cls.__name__, (_CONVERTED[stock], cls), {
                "__module__": __name__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                "stock_class": cls, "__reduce_ex__": _reduce_twin,
            })
        _SUBCLASS_TWINS[cls] = twin
    return _SUBCLASS_TWINS[cls]


def _stock_of(cls):
    """The class convert() made `cls` from (revert's map), or None."""
    return _REVERTED.get(cls) or cls.__dict__.get("stock_class")


def _swap_classes(model: nn.Module, new_class_of) -> nn.Module:
    for module in model.modules():
        new_class = new_class_of(type(module))
        if new_class is not None:
            module.__class__ = new_class
    return model


def convert(model: nn.Module) -> nn.Module:
    """Makes every nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d in `model` (the model itself
    included) its torch_convbp twin, in place, and returns the model. Only the class
    changes; parameters, buffers, hooks and training mode stay. A subclass of those classes that
    overrides neither forward nor _conv_forward (torchvision's Conv3DSimple, say) becomes a
    class of its name with torch_convbp's computation and the subclass's other methods (an
    instance of both); one that overrides either is left alone (its forward may do more)."""
    return _swap_classes(model, _twin_of)


def revert(model: nn.Module) -> nn.Module:
    """The inverse of convert(): every torch_convbp module in `model` becomes its stock class
    again (nn's, or the subclass it was made from), in place (for deployment where torch_convbp is
    not installed, say). Returns the model."""
    return _swap_classes(model, _stock_of)

"""Run a KerasHub model's layers without Keras's per-call machinery.

Keras's `Layer.__call__` wraps every `call()` in input conversion, call-spec
binding, build checks, name scopes, mask bookkeeping and `nn.Module` hooks.
That costs tens of microseconds per sublayer per step, and torch.compile
cannot trace it (Dynamo stops in `CallSpec`'s `inspect.signature` binding), so
vLLM's compiled mode could not run a KerasHub model at all.

`use_direct_calls(model)` gives each of the model's (already built) layers a
`__call__` that keeps what serving needs from Keras's and skips the rest:
the quantized-call dispatch, dropping context arguments (`training`) a
`call()` does not take, and the autocast of floating inputs to the layer's
compute dtype. The layers' own `call()` math is unchanged. Only the given
model's layers change class, so any other Keras model in the process keeps
Keras's own `__call__`.
"""

import keras
import torch

_DIRECT_CLASSES = {}


def _autocast_input(value, dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_autocast_input(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: _autocast_input(item, dtype) for key, item in value.items()}
    return value


def direct_call(self, *args, **kwargs):
    if not self.built:
        # Keras's own `__call__` builds the layer (weightless ones such as
        # ALiBi biases and rotary embeddings are built on first use).
        return self._keras_call(*args, **kwargs)
    for name in self._direct_dropped_args:
        kwargs.pop(name, None)
    dtype = self._direct_input_dtype
    if dtype is not None:
        args = _autocast_input(args, dtype)
        if kwargs:
            kwargs = _autocast_input(kwargs, dtype)
    if self._direct_quantized:
        return self.quantized_call(*args, **kwargs)
    return self.call(*args, **kwargs)


def _direct_class(cls):
    if cls not in _DIRECT_CLASSES:
        _DIRECT_CLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__call__": direct_call,
                "_keras_call": cls.__call__,
                "__module__": cls.__module__,
            },
        )
    return _DIRECT_CLASSES[cls]


def _torch_dtype(name):
    dtype = getattr(torch, keras.backend.standardize_dtype(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def use_direct_calls(model):
    """Makes every layer of a built Keras model call its `call()` directly.

    A layer not built yet keeps Keras's `__call__` until its first call
    has built it. What Keras's `__call__` would decide per call from a
    layer's fixed settings (context arguments its `call()` lacks, the
    autocast dtype, quantization) is decided here, once.

    Args:
        model: A built Keras model on the torch backend, e.g. a KerasHub
            backbone. Its layers must not be called symbolically (functional
            construction), trained or quantized afterwards.

    Returns:
        The number of layers changed.
    """
    layers = list(model._flatten_layers(include_self=True))
    for layer in layers:
        layer._direct_dropped_args = tuple(
            name
            for name in layer._call_context_args
            if not layer._call_has_context_arg.get(name, False)
        )
        autocast = layer._convert_input_args and layer.autocast
        layer._direct_input_dtype = (
            _torch_dtype(layer.input_dtype) if autocast else None
        )
        layer._direct_quantized = (
            getattr(layer, "quantization_mode", None) is not None
        )
        if type(layer).__call__ is not direct_call:
            layer.__class__ = _direct_class(type(layer))
    return len(layers)

"""A float32 tied output embedding's projection on oneDNN, over its one table.

A tied `ReversibleEmbedding` is also the input embedding, so its table
cannot move to a packed layout without a second copy, which vLLM's own
CPU models do keep (`UnquantizedEmbeddingMethod` packs with
`remove_weight=False`). Here it stays one tensor, and in float32 its
output projection runs on oneDNN over that tensor instead of aten's matmul.
"""

import torch
from keras import ops

_CLASSES = {}


def unpacked_linear(inputs, weight, bias=None):
    """`inputs @ weight.T` on oneDNN over an unpacked `(out, in)` tensor.

    For a table that is also looked up, so it stays one tensor: aten's
    float32 matmul is MKL's here; oneDNN on the same unpacked (vocab,
    hidden) tensor took 27 ms instead of 38 ms for SmolLM2's 49152 x 576 at
    32 rows (one thread). In bfloat16 aten already calls oneDNN. At 2 to 8
    rows it takes up to 2x the time of vLLM's packed copy, which this does
    not hold (docs/performance.md, "Serving over HTTP").
    """
    out = torch.ops.mkldnn._linear_pointwise(
        inputs.reshape(-1, inputs.shape[-1]), weight, bias, "none", [], ""
    )
    return out.reshape(*inputs.shape[:-1], out.shape[-1])


def soft_capped(layer, logits):
    """`logits` under `layer`'s final soft cap, as `ReversibleEmbedding` does.

    Args:
        layer: A `ReversibleEmbedding`, tied or not.
        logits: Its output projection of the hidden states.
    """
    if layer.logit_soft_cap is None:
        return logits
    soft_cap = layer.logit_soft_cap
    return ops.multiply(ops.tanh(ops.divide(logits, soft_cap)), soft_cap)


def use_unpacked_linear(layer):
    """Runs a float32 tied `layer`'s output projection on `unpacked_linear`.

    Args:
        layer: Any Keras layer.

    Returns:
        Whether `layer` is such an embedding (and now runs so).
    """
    if not _is_float32_tied_output(layer):
        return False
    cls = type(layer)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {"call": _call, "_keras_layer_call": cls.call, "__module__": cls.__module__},
        )
    layer.__class__ = _CLASSES[cls]
    return True


def _call(self, inputs, reverse=False):
    if not reverse:
        return self._keras_layer_call(inputs)
    return soft_capped(self, unpacked_linear(inputs, self.embeddings.value))


def _is_float32_tied_output(layer):
    from keras.layers import ReversibleEmbedding

    return (
        isinstance(layer, ReversibleEmbedding)
        and layer.tie_weights
        and layer.reverse_dtype is None
        and layer.compute_dtype == "float32"
        and layer.embeddings.dtype == "float32"
        and getattr(layer, "quantization_mode", None) is None
        and not getattr(layer, "lora_enabled", False)
        and torch.backends.mkldnn.is_available()
    )

"""A tied output embedding's projection on vLLM's CPU GEMM, beside its table.

A tied `ReversibleEmbedding` is also the input lookup, so Keras's table
stays, and the output projection multiplies by a copy vLLM's CPU GEMM
dispatch packs of it, as vLLM's own CPU models hold a tied head
(`UnquantizedEmbeddingMethod` packs with `remove_weight=False`). Where the
dispatch does not pack (bfloat16 without AVX-512 BF16 or AMX), its
`F.linear` runs over the table itself and nothing is copied.

One copy, multiplied unpacked on oneDNN, was tried and measured: at the 2
to 12 rows a server's steps carry, SmolLM2's 49152 x 576 table took 1.6 to
2.4x the packed copy's time (`bench/head.py`; docs/decisions.md).
"""

from keras import ops

_CLASSES = {}


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


def use_packed_head(layer, pack):
    """Runs a tied `layer`'s output projection on a GEMM `pack` makes.

    Args:
        layer: Any Keras layer.
        pack: `pack(matrix)` hands an `(in, out)` matrix to vLLM's CPU GEMM
            dispatch and returns `matmul(rows)` (`linear._pack`).

    Returns:
        Whether `layer` is a tied output embedding (and now runs so).
    """
    if not _is_tied_output(layer):
        return False
    layer._packed_head = pack(layer.embeddings.value.detach().t())
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
    rows = inputs.reshape(-1, inputs.shape[-1])
    if not rows.is_contiguous():
        rows = rows.contiguous()
    logits = self._packed_head(rows)
    return soft_capped(self, logits.reshape(*inputs.shape[:-1], logits.shape[-1]))


def _is_tied_output(layer):
    from keras.layers import ReversibleEmbedding

    return (
        isinstance(layer, ReversibleEmbedding)
        and layer.tie_weights
        and layer.reverse_dtype is None
        and layer.embeddings.dtype == layer.compute_dtype
        and layer.embeddings.value.numel() > 0
        and getattr(layer, "quantization_mode", None) is None
        and not getattr(layer, "lora_enabled", False)
    )

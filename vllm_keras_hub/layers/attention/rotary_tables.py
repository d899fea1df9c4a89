"""Rotary cos/sin computed once per position, as vLLM's rotary layers keep.

KerasHub's `RotaryEmbedding` computes its inverse frequencies, then the cos
and sin of position x frequency, on every call: for the query and for the
key of every layer. Compiled, Inductor inlines that into each rotation
kernel, so every element of every head computes a `pow`, a `cos` and a
`sin`: the two rotation kernels of a SmolLM2 layer took 83 us a step in
bfloat16 (the average over a run of 32 requests), against 8 us for vLLM's
own rotary, which reads a table.

`use_rotary_tables(model, max_positions)` gives each `RotaryEmbedding` that
keeps KerasHub's `_compute_cos_sin_embedding` a table of that method's own
results for positions `0 .. max_positions - 1`, computed eagerly on the
layer's first call with per-token integer positions (the start-up probe)
and shared by layers with the same settings. Calls with integer positions
then gather rows of it; any other call runs KerasHub's method.

Inside a served step (`step.scope(rotary_rows={})`) every rotary call
sees the step's positions (each route reshapes vLLM's), so the rows gathered
for a table are gathered once a step and shared by all layers and by queries
and keys: one gather in the compiled graph instead of two a layer.
"""

import torch

from vllm_keras_hub.layers import step

_TABLE_CLASSES = {}


def _compute_cos_sin_embedding(self, inputs, start_index=0, positions=None):
    if positions is None or positions.is_floating_point():
        return self._keras_cos_sin(inputs, start_index, positions)
    key = (self._rotary_table_key, inputs.shape[-1])
    tables = self._rotary_tables
    if key not in tables:
        if torch.compiler.is_compiling():
            return self._keras_cos_sin(inputs, start_index, positions)
        tables[key] = _table(self, inputs)
    rows = step.current().rotary_rows
    if rows is None:
        return _gather(tables[key], inputs, positions)
    layout = (key, inputs.ndim, positions.ndim)
    if layout not in rows:
        rows[layout] = _gather(tables[key], inputs, positions)
    return rows[layout]


def _gather(table, inputs, positions):
    """The rows of `table` at `positions`, in KerasHub's layout."""
    cos, sin = table
    if positions.ndim == 1:
        positions = positions[None]
    cos, sin = cos[positions], sin[positions]
    if cos.shape[-1] != inputs.shape[-1]:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    # KerasHub's embedding is (batch, sequence, 1 per other axis, features).
    shape = (*positions.shape, *[1] * (inputs.ndim - 3), inputs.shape[-1])
    return cos.reshape(shape), sin.reshape(shape)


def _table(layer, inputs):
    """The layer's own cos and sin at every position, `(positions, features)`.

    KerasHub repeats the frequencies for the two halves of the features;
    where the halves are equal only one is kept, as in vLLM's cache.
    """
    size = layer._rotary_table_size
    with torch.inference_mode(False), torch.no_grad():
        cos, sin = layer._keras_cos_sin(
            torch.zeros(1, size, inputs.shape[-1], dtype=inputs.dtype),
            positions=torch.arange(size)[None],
        )
    cos, sin = cos.reshape(size, -1), sin.reshape(size, -1)
    cos_halves, sin_halves = cos.chunk(2, -1), sin.chunk(2, -1)
    if torch.equal(*cos_halves) and torch.equal(*sin_halves):
        return cos_halves[0].clone(), sin_halves[0].clone()
    return cos, sin


def _table_class(cls):
    if cls not in _TABLE_CLASSES:
        _TABLE_CLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {
                "_compute_cos_sin_embedding": _compute_cos_sin_embedding,
                "_keras_cos_sin": cls._compute_cos_sin_embedding,
                "__module__": cls.__module__,
            },
        )
    return _TABLE_CLASSES[cls]


def _settings(layer):
    """What a layer's cos/sin depend on besides positions and features."""
    config = layer.get_config()
    config.pop("name", None)
    config.pop("trainable", None)
    cls = type(layer)
    return (
        f"{cls.__module__}.{cls.__qualname__} {layer.compute_dtype} "
        f"{sorted(config.items())}"
    )


def use_rotary_tables(model, max_positions):
    """Gives a model's KerasHub rotary layers per-position cos/sin tables.

    Layers whose class computes cos/sin its own way (Phi-3's su-scaled
    rotary, for example) keep it.

    Args:
        model: A Keras model on the torch backend.
        max_positions: Positions each table covers; vLLM's `max_model_len`.

    Returns:
        The number of rotary layers that use a table.
    """
    from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding

    keras_method = RotaryEmbedding._compute_cos_sin_embedding
    tables = {}
    count = 0
    for layer in model._flatten_layers(include_self=True):
        if not isinstance(layer, RotaryEmbedding):
            continue
        if type(layer)._compute_cos_sin_embedding is not keras_method:
            continue
        # Past Keras's attribute tracking, which would give each layer its
        # own copy of the dict.
        object.__setattr__(layer, "_rotary_tables", tables)
        layer._rotary_table_key = _settings(layer)
        layer._rotary_table_size = int(max_positions)
        layer.__class__ = _table_class(type(layer))
        count += 1
    return count

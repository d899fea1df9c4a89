"""Qwen3.5: hybrid, Gated DeltaNet layers beside gated full attention.

The GDN layers keep their state in vLLM's state cache
(`layers/state/state_routes.py`); every 4th layer attends. With images, the
attention rotates at M-RoPE positions (`media.py`).
"""

from keras import ops
from keras_hub.src.models.qwen3_5.qwen3_5_attention import _apply_mrope

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import partial_rotary
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.attention_routes import unfused_window


def attention(layer, hidden_states, positions):
    # `Qwen3_5Attention` (Qwen3.5's full-attention layers): the query
    # projection carries a per-head output gate beside each head's query;
    # q/k RMSNorm, then RoPE on the first `rotary_dim` features only. The
    # window as for Qwen3 (`unfused_window`). Where the step has M-RoPE
    # positions (images: `media.py`), the layer's own `_apply_mrope`
    # at them, as `_apply_partial_rope` with `position_ids`.
    mrope = step.current().mrope_positions
    if mrope is not None and layer.mrope_section is not None:
        cos, sin = mrope_cos_sin(layer, mrope)

        def rotate(x):
            return mrope_rotate(x, cos, sin, layer.rotary_dim)
    else:

        def rotate(x):
            return partial_rotary(
                layer.rotary_embedding_layer, x, layer.rotary_dim, positions
            )

    query_and_gate = layer._query_dense(hidden_states)
    query = rotate(layer._query_norm(query_and_gate[..., : layer.head_dim]))
    gate = query_and_gate[..., layer.head_dim :]
    key = rotate(layer._key_norm(layer._key_dense(hidden_states)))
    value = layer._value_dense(hidden_states)
    output = attend(
        layer, query, key, value, unfused_window(layer.sliding_window_size)
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, -1)) * ops.sigmoid(
        ops.reshape(gate, (num_tokens, 1, -1))
    )
    # The rank's heads under tensor parallelism, not `num_query_heads`.
    output = ops.reshape(output, (num_tokens, 1, -1, layer.head_dim))
    return layer._output_dense(output)


def mrope_cos_sin(layer, mrope):
    """The cos and sin of the step's M-RoPE positions, as the layer's own
    `_apply_mrope` computes them, once a step for all layers alike.

    `_apply_mrope` computes them anew for each query and key of each layer.
    Its rotation is linear in its input: on `[1, ..., 1, 0, ..., 0]` it
    gives each feature pair's cos in the first half and sin in the second.

    Args:
        layer: A `Qwen3_5Attention` with `mrope_section`.
        mrope: The step's `(3, num_tokens)` positions.

    Returns:
        float32 `(cos, sin)`, `(num_tokens, 1, 1, rotary_dim)` each.
    """
    rotary_dim, half = layer.rotary_dim, layer.rotary_dim // 2
    rotary = layer.rotary_embedding_layer
    key = ("mrope", rotary_dim, tuple(layer.mrope_section), rotary.max_wavelength)
    rows = step.current().rotary_rows
    if rows is not None and key in rows:
        return rows[key]
    # KerasHub's channels: (text, temporal, height, width), the first
    # unused; each token a batch row of one.
    position_ids = ops.stack([mrope[0], mrope[0], mrope[1], mrope[2]], axis=1)[..., None]
    basis = ops.concatenate([ops.ones((half,)), ops.zeros((half,))])
    basis = ops.broadcast_to(ops.cast(basis, "float32"), (ops.shape(mrope)[1], 1, 1, rotary_dim))
    both = _apply_mrope(basis, rotary, position_ids, layer.mrope_section, rotary_dim)
    cos = ops.concatenate([both[..., :half], both[..., :half]], axis=-1)
    sin = ops.concatenate([both[..., half:], both[..., half:]], axis=-1)
    if rows is not None:
        rows[key] = (cos, sin)
    return cos, sin


def mrope_rotate(x, cos, sin, rotary_dim):
    """`x`'s first `rotary_dim` features rotated by `mrope_cos_sin`'s cos
    and sin, in float32 as `_apply_mrope` rotates them; the rest as they are.

    Args:
        x: `(num_tokens, 1, heads, head_dim)` queries or keys.
        cos: `mrope_cos_sin`'s cos.
        sin: `mrope_cos_sin`'s sin.
        rotary_dim: The layer's `rotary_dim`.
    """
    x_rope = ops.cast(x[..., :rotary_dim], "float32")
    x1, x2 = x_rope[..., : rotary_dim // 2], x_rope[..., rotary_dim // 2 :]
    rotated = x_rope * cos + ops.concatenate([-x2, x1], axis=-1) * sin
    return ops.concatenate([ops.cast(rotated, x.dtype), x[..., rotary_dim:]], axis=-1)


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # Text-only presets run their own graph.
    if backbone.text_only_model:
        return None
    # `Qwen3_5Backbone`'s graph without images (its `__call__` would run the
    # vision encoder on none): token embeddings, the layers, the final norm;
    # at a pipeline stage, its own layers (the norm on the last).
    start, end = layers or (0, len(backbone.transformer_layers))
    x = backbone.token_embedding(token_ids) if hidden is None else hidden
    for layer in backbone.transformer_layers[start:end]:
        x = layer(x, decoder_padding_mask=padding_mask)
    if end < len(backbone.transformer_layers):
        return x
    return backbone.layer_norm(x)


# The KerasHub layer that keeps a recurrent state, not a KV cache.
STATE_LAYERS = ("Qwen3_5GatedDeltaNet",)

FAMILY = Family(
    "qwen3_5",
    "Qwen3.5",
    "Qwen3_5Backbone",
    OURS,
    tensor_parallel=True,
    hybrid=True,
    attention={"Qwen3_5Attention": Route(attention)},
    state_layers=STATE_LAYERS,
    text_forward=text_forward,
    text_loop=lambda backbone: not backbone.text_only_model,
    image_architecture=architectures.MROPE,
)

"""What every attention route to vLLM shares: the `Route` and its helpers.

A route (one per KerasHub attention-layer class, in its family's module under
`families/`) mirrors its layer's own `call`: the layer's own projections, its
own rotary layer at vLLM's per-token positions, unexpanded K/V with the
layer's own scale, sliding window, soft cap, ALiBi slopes or sinks to the
layer's own kernel (`paged_attention.py`), then its own output projection.
Each takes `(layer, hidden_states, positions)`, positions shaped
`(num_tokens, 1)`. `layers/attention/attention.py` installs them.
"""

import dataclasses

from keras import ops
from keras_hub.src.utils.keras_utils import fused_attention_op_available

from vllm_keras_hub.layers.attention.paged_attention import paged_attention

# What an attention layer's `call` returns, as its decoder unpacks it.
OUTPUT = "output"  # and `(output, cache)` where a cache is passed
OUTPUT_AND_CACHE = "output_and_cache"  # even when the cache is `None`
OUTPUT_WEIGHTS_AND_CACHE = "output_weights_and_cache"


@dataclasses.dataclass(frozen=True)
class Route:
    """How one attention-layer class hands its attention to vLLM.

    Attributes:
        forward: `forward(layer, hidden_states, positions)`, the layer's
            output, positions shaped `(num_tokens, 1)`.
        returns: What the class's `call` returns (`OUTPUT`, ...).
        kv_sharing_targets: `targets(backbone)`, per layer the index of the
            earlier layer whose K/V it reads (`None`: its own). Read once at
            install into each layer's `_vllm_kv_sharing_target`; the serving
            model gives that layer's vLLM `Attention` the target's cache.
        alibi_slopes: `slopes(transformer_layer, layer)`, as vLLM adds them
            (after the softmax scale); read at install into
            `_vllm_alibi_slopes`.
        sliding_window: `window(transformer_layer, layer)`, decided once at
            install into `_vllm_sliding_window`.
    """

    forward: object
    returns: str = OUTPUT
    kv_sharing_targets: object = None
    alibi_slopes: object = None
    sliding_window: object = None


def partial_rotary(rotary, x, rotary_dim, positions):
    """`rotary` at per-token `positions` on the first `rotary_dim` features."""
    if rotary_dim >= x.shape[-1]:
        return rotary(x, positions=positions)
    rotated = rotary(x[..., :rotary_dim], positions=positions)
    return ops.concatenate((rotated, x[..., rotary_dim:]), axis=-1)


# The q/k/v projections' names: public (Mixtral, Qwen-MoE) or private.
PUBLIC_QKV = ("query_dense", "key_dense", "value_dense")
PRIVATE_QKV = ("_query_dense", "_key_dense", "_value_dense")


def rotary_qkv(layer, hidden_states, positions, names):
    """The layer's q/k/v projections, q and k through its own rotary layer."""
    query_dense, key_dense, value_dense = (getattr(layer, name) for name in names)
    rotary = layer.rotary_embedding_layer
    return (
        rotary(query_dense(hidden_states), positions=positions),
        rotary(key_dense(hidden_states), positions=positions),
        value_dense(hidden_states),
    )


def attend(layer, query, key, value, sliding_window=None, **options):
    """The layer's heads through vLLM, with its own scale and KV heads.

    Args:
        layer: The attention layer (`_inv_norm_factor`, `num_key_value_heads`).
        query, key, value: Its projected (and rotated) heads.
        sliding_window: The window as vLLM counts it, query included.
        **options: The kernel's other options (e.g. `sinks`).
    """
    return paged_attention(
        layer,
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
        **options,
    )


def unfused_window(sliding_window):
    """The window `generate()` applies: none where it runs the fused op.

    KerasHub bug: Qwen's, Qwen3's and Qwen3.5's `_compute_attention` apply
    `sliding_window_size` only on their non-fused path, and the fused one
    runs wherever `fused_attention_op_available()` (torch 2.x and JAX), so
    `generate()` attends to the whole context. Served as the layer computes.
    """
    if fused_attention_op_available():
        return None
    return sliding_window or None


def multi_head(layer, hidden_states, positions):
    # Keras's `MultiHeadAttention`, as KerasHub's `TransformerEncoder` (the
    # encoder families) calls it on self-attention: no position encoding inside.
    query = layer._query_dense(hidden_states)
    key = layer._key_dense(hidden_states)
    value = layer._value_dense(hidden_states)
    output = paged_attention(
        layer,
        query,
        key,
        value,
        layer._inverse_sqrt_key_dim,
        num_kv_heads=layer._num_heads,
    )
    return layer._output_dense(output)


def alibi_attention(layer, hidden_states, dense_layers):
    # Multi-head attention with biases whose ALiBi slopes go to vLLM.
    query_dense, key_dense, value_dense, output_dense = dense_layers
    output = paged_attention(
        layer,
        query_dense(hidden_states),
        key_dense(hidden_states),
        value_dense(hidden_states),
        layer.inv_norm_factor,
        alibi_slopes=layer._vllm_alibi_slopes,
    )
    num_tokens = ops.shape(hidden_states)[0]
    # The rank's heads under tensor parallelism, all heads otherwise.
    output = ops.reshape(output, (num_tokens, 1, -1))
    return output_dense(output)


def kv_placeholder(query, num_kv_heads):
    # The kernel's caller reads the KV head count from `key`; a KV-sharing
    # layer's kernel reads its target's cache instead and takes no K/V.
    return ops.zeros_like(query[:, :, :num_kv_heads, :])


# Keras's own class, in KerasHub's `TransformerEncoder`: every encoder family's.
ENCODER_ROUTES = {"MultiHeadAttention": Route(multi_head)}

"""Bloom: ALiBi attention, its slopes handed to vLLM."""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import alibi_attention
from vllm_keras_hub.layers.attention.attention_routes import Route


def attention(layer, hidden_states, positions):
    # `BloomAttention`: its `AlibiBias` adds `slope * (key_position -
    # last_key_position)` to the scaled scores, which softmax sees exactly as
    # vLLM's `slope * (key_position - query_position)` (a constant per query
    # row); slopes are in head order.
    return alibi_attention(
        layer,
        hidden_states,
        (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense),
    )


def alibi_slopes(transformer_layer, layer):
    return layer._alibi_layer._get_slopes(layer.num_heads)


FAMILY = Family(
    "bloom",
    "Bloom",
    "BloomBackbone",
    OURS,
    tensor_parallel=True,
    attention={"BloomAttention": Route(attention, alibi_slopes=alibi_slopes)},
)

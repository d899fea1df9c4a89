"""Falcon (RW-1B): ALiBi attention, its slopes handed to vLLM."""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import alibi_attention
from vllm_keras_hub.layers.attention.attention_routes import Route


def attention(layer, hidden_states, positions):
    # `FalconAttention` (RW-1B): the ALiBi bias comes from its decoder
    # (`slope * key_position`), added before the softmax scale.
    return alibi_attention(
        layer,
        hidden_states,
        (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense),
    )


def alibi_slopes(transformer_layer, layer):
    # `FalconTransformerDecoder._build_alibi_tensor`'s slopes; the bias is
    # added before the scale, so vLLM (which adds it after) gets them scaled.
    slopes = transformer_layer._get_slopes(layer.num_heads)
    return [slope * layer.inv_norm_factor for slope in slopes]


FAMILY = Family(
    "falcon",
    "Falcon",
    "FalconBackbone",
    OURS,
    tensor_parallel=True,
    attention={"FalconAttention": Route(attention, alibi_slopes=alibi_slopes)},
)

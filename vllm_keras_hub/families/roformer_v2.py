"""RoFormerV2: its text classifiers, attention bidirectional and rotary."""

from keras import ops

from vllm_keras_hub.families.bert import segment_ids
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.paged_attention import paged_attention


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # Its graph masks token id 0 (the padding its preprocessor packs); vLLM
    # packs none, and the routes attend over each text's own tokens.
    return backbone(
        {"token_ids": token_ids, "segment_ids": segment_ids(token_ids)}, training=False
    )


def _rotate(embedding, tensors, positions):
    # `RoformrPositionalEmbedding.call` numbers positions from its input's
    # length; here its own sinusoid and rotation at vLLM's per-token positions.
    dtype = tensors[0].dtype
    sinusoidal = embedding.sinusoidal_embeddings(
        ops.cast(positions, dtype), embedding.output_dim, embedding.max_wavelength
    )
    sinusoidal = ops.cast(sinusoidal, embedding.compute_dtype)[:, :, None, :]
    cos = ops.repeat(sinusoidal[..., 1::2], 2, -1)
    sin = ops.repeat(sinusoidal[..., ::2], 2, -1)
    rotated = []
    for tensor in tensors:
        turned = ops.stack([-tensor[..., 1::2], tensor[..., ::2]], ops.ndim(tensor))
        rotated.append(tensor * cos + ops.reshape(turned, ops.shape(tensor)) * sin)
    return rotated


def project(layer, hidden_states):
    """A `RoformerAttention`'s (or ESM's) query, key and value heads."""
    heads = (-1, 1, layer.heads, layer.head_size)
    return [
        ops.reshape(dense(hidden_states), heads)
        for dense in (layer.q_dense, layer.k_dense, layer.v_dense)
    ]


def attend(layer, query, key, value):
    """Its heads over the text's own tokens, with `dot_product_attention`'s
    default scale, through its output projection."""
    output = paged_attention(
        layer, query, key, value, layer.head_size**-0.5, num_kv_heads=layer.heads
    )
    return layer.o_dense(ops.reshape(output, (-1, 1, layer.heads * layer.head_size)))


def roformer_attention(layer, hidden_states, positions):
    # `RoformerAttention.call`, its rotation at vLLM's positions.
    query, key, value = project(layer, hidden_states)
    query, key = _rotate(layer.rotary_embedding_layer, (query, key), positions)
    return attend(layer, query, key, value)


FAMILY = Family(
    "roformer_v2",
    "RoFormerV2",
    "RoformerV2Backbone",
    OURS,
    embedder_only=True,
    attention={"RoformerAttention": Route(roformer_attention)},
    text_forward=text_forward,
)

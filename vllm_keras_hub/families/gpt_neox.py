"""GPT-NeoX: served as the model's forward computes it.

KerasHub's own cached decode rotates the query at position 0 (`attention`).
"""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import OUTPUT_AND_CACHE
from vllm_keras_hub.layers.attention.attention_routes import partial_rotary
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.paged_attention import paged_attention


def attention(layer, hidden_states, positions):
    # `GPTNeoXAttention`: fused per-head q/k/v projection, RoPE on the first
    # `rotary_dim` features of each head only. Here the query is rotated at
    # its own position; KerasHub's cached decode (what `generate()` runs)
    # rotates it at position 0, a KerasHub bug, so serving matches the
    # layer's full-sequence forward instead (see `model_test.py`).
    query_key_value = layer._qkv_dense(hidden_states)
    size = layer.attn_head_size
    query = query_key_value[..., :size]
    key = query_key_value[..., size : 2 * size]
    value = query_key_value[..., 2 * size :]

    def rotate(x):
        return partial_rotary(layer.rotary_embedding_layer, x, layer.rotary_dim, positions)

    output = paged_attention(
        layer, rotate(query), rotate(key), value, layer._inv_norm_factor
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, -1))
    return layer._output_dense(output)


FAMILY = Family(
    "gpt_neox",
    "GPT-NeoX",
    "GPTNeoXBackbone",
    OURS,
    tensor_parallel=True,
    attention={"GPTNeoXAttention": Route(attention, returns=OUTPUT_AND_CACHE)},
)

"""Qwen3: our attention route, not keras-hub's.

keras-hub's passes a sliding window that Qwen3's `generate()` never applies on
torch (`unfused_window`).
"""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.attention_routes import unfused_window


def attention(layer, hidden_states, positions):
    # `Qwen3Attention` and its copy `Qwen3MoeAttention`: per-head q/k RMSNorm
    # before RoPE. Replaces keras-hub's own Qwen3 route, which passes the
    # window that `generate()` never applies (`unfused_window`; its HF
    # converter also sets the window even when HF's `use_sliding_window` is
    # off).
    query = layer._query_dense_layer_norm(layer._query_dense(hidden_states))
    query = layer.rotary_embedding_layer(query, positions=positions)
    key = layer._key_dense_layer_norm(layer._key_dense(hidden_states))
    key = layer.rotary_embedding_layer(key, positions=positions)
    value = layer._value_dense(hidden_states)
    window = unfused_window(layer.sliding_window_size)
    return layer._output_dense(attend(layer, query, key, value, window))


FAMILY = Family(
    "qwen3",
    "Qwen3",
    "Qwen3Backbone",
    OURS,
    tensor_parallel=True,
    attention={"Qwen3Attention": Route(attention)},
    embedder="Qwen3TextEmbedder",
)

"""Qwen 2/2.5: our attention route, not keras-hub's.

keras-hub's passes a sliding window that Qwen's `generate()` never applies on
torch (`unfused_window`).
"""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import PRIVATE_QKV
from vllm_keras_hub.layers.attention.attention_routes import rotary_qkv
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.attention_routes import unfused_window


def attention(layer, hidden_states, positions):
    # `QwenAttention` (Qwen 2/2.5). Replaces keras-hub's own route, which
    # passes the window `generate()` never applies (`unfused_window`).
    query, key, value = rotary_qkv(layer, hidden_states, positions, PRIVATE_QKV)
    window = layer.sliding_window_size if layer.use_sliding_window_attention else None
    return layer._output_dense(attend(layer, query, key, value, unfused_window(window)))


FAMILY = Family(
    "qwen",
    "Qwen 2/2.5",
    "QwenBackbone",
    OURS,
    tensor_parallel=True,
    attention={"QwenAttention": Route(attention)},
)

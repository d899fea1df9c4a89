"""Qwen1.5-MoE: Qwen's attention with public q/k/v, sparse MoE with a shared expert."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import PUBLIC_QKV
from vllm_keras_hub.layers.attention.attention_routes import rotary_qkv
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_variables
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_weights
from vllm_keras_hub.layers.moe.moe_routing import MoERoute
from vllm_keras_hub.layers.moe.moe_routing import silu_expert_bank_spec
from vllm_keras_hub.layers.moe.moe_routing import top_k_routing


def sliding_window(transformer_layer, layer):
    # `QwenMoeAttention._compute_attention` applies its window only on its
    # non-fused path, and `_use_fused_attention_op()` takes the fused one
    # on GPUs (but T4s) and TPUs only: on the CPU it windows, on most GPUs
    # it does not. Decided once, at install, as the layer decides it.
    if layer.use_sliding_window_attention and not layer._use_fused_attention_op():
        return layer.sliding_window_size
    return None


def attention(layer, hidden_states, positions):
    # `QwenMoeAttention`: Qwen's attention (q/k/v biases) with public q/k/v.
    query, key, value = rotary_qkv(layer, hidden_states, positions, PUBLIC_QKV)
    window = layer._vllm_sliding_window
    return layer._output_dense(attend(layer, query, key, value, window))


def moe_call(self, hidden_states, attention_mask=None, training=None):
    # Qwen1.5-MoE: plus a shared expert gated by a sigmoid, KerasHub's own
    # layers, computed first (vLLM may reuse the routed input's buffer).
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    shared = self.shared_expert_dense(x)
    shared *= ops.sigmoid(self.shared_expert_gate_dense(x))
    router_logits, routing = top_k_routing(self, x, self.norm_top_k_prob)
    out = moe.fused_experts(self, x, routing) + shared
    return ops.reshape(out, shape), router_logits


FAMILY = Family(
    "qwen_moe",
    "Qwen1.5-MoE",
    "QwenMoeBackbone",
    OURS,
    tensor_parallel=True,
    attention={"QwenMoeAttention": Route(attention, sliding_window=sliding_window)},
    moe={
        "QwenSparseMoeBlock": MoERoute(
            moe_call, silu_expert_bank_spec, fused_gate_up_weights, fused_gate_up_variables
        )
    },
)

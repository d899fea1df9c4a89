"""Qwen3-MoE: Qwen3's attention (a copy of its class), sparse MoE."""

from keras import ops

from vllm_keras_hub.families import qwen3
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_variables
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_weights
from vllm_keras_hub.layers.moe.moe_routing import MoERoute
from vllm_keras_hub.layers.moe.moe_routing import silu_expert_bank_spec
from vllm_keras_hub.layers.moe.moe_routing import top_k_routing


def moe_call(self, hidden_states, attention_mask=None, training=None):
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_logits, routing = top_k_routing(self, x, self.norm_top_k_prob)
    out = moe.fused_experts(self, x, routing)
    return ops.reshape(out, shape), router_logits


FAMILY = Family(
    "qwen3_moe",
    "Qwen3-MoE",
    "Qwen3MoeBackbone",
    OURS,
    tensor_parallel=True,
    attention={"Qwen3MoeAttention": Route(qwen3.attention)},
    moe={
        "Qwen3SparseMoeBlock": MoERoute(
            moe_call, silu_expert_bank_spec, fused_gate_up_weights, fused_gate_up_variables
        )
    },
)

"""Mixtral: Mistral's attention with public sublayers, and sparse MoE."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import PUBLIC_QKV
from vllm_keras_hub.layers.attention.attention_routes import rotary_qkv
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import gate_up_down_weights
from vllm_keras_hub.layers.moe.moe_routing import MoERoute
from vllm_keras_hub.layers.moe.moe_routing import silu_expert_bank_spec
from vllm_keras_hub.layers.moe.moe_routing import top_k_routing


def attention(layer, hidden_states, positions):
    # `CachedMixtralAttention`: a copy of Mistral's with public sublayers.
    query, key, value = rotary_qkv(layer, hidden_states, positions, PUBLIC_QKV)
    return layer.output_dense(attend(layer, query, key, value, layer.sliding_window))


def moe_call(self, hidden_states, attention_mask=None, training=False):
    # Router jitter applies in training only.
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_logits, routing = top_k_routing(self, x, normalize=True)
    out = moe.fused_experts(self, x, routing)
    return ops.reshape(out, shape), router_logits


def moe_variables(block):
    experts = block.expert_bank
    return [
        experts._expert_feedforward_gate_dense,
        experts._expert_feedforward_intermediate_dense,
        experts._expert_feedforward_output_dense,
    ]


def moe_weights(block, read):
    return gate_up_down_weights(moe_variables(block), read)


FAMILY = Family(
    "mixtral",
    "Mixtral",
    "MixtralBackbone",
    OURS,
    tensor_parallel=True,
    attention={"CachedMixtralAttention": Route(attention)},
    moe={
        "MixtralSparseMoeBlock": MoERoute(
            moe_call, silu_expert_bank_spec, moe_weights, moe_variables
        )
    },
)

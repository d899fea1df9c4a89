"""Qwen3.5-MoE: Qwen3.5's layers, sparse MoE with a gated shared expert."""

from keras import ops

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families import qwen3_5
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import dense_routing
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_variables
from vllm_keras_hub.layers.moe.moe_routing import fused_gate_up_weights
from vllm_keras_hub.layers.moe.moe_routing import MoERoute


def moe_call(self, hidden_states, attention_mask=None, training=None):
    # `Qwen3_5MoeSparseMoeBlock.call`: a sigmoid-gated shared expert (KerasHub's
    # own layers, computed first), softmax top-k routing always normalised.
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    shared = ops.sigmoid(self._shared_expert_gate(x)) * self.shared_expert(x)
    router_logits = self._router_gate(x)
    top_p, top_i = ops.top_k(ops.softmax(router_logits, axis=-1), k=self.top_k)
    top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
    routing = dense_routing(top_p, top_i, self.num_experts, x.dtype)
    out = moe.fused_experts(self, x, routing) + shared
    return ops.reshape(out, shape), router_logits


def moe_spec(block):
    # `Qwen3_5MoeExperts.call` gates with SiLU, fixed (no `activation`).
    return moe.MoESpec(
        block.num_experts, block.top_k, block.hidden_dim, block.moe_intermediate_dim, "silu"
    )


FAMILY = Family(
    "qwen3_5_moe",
    "Qwen3.5-MoE",
    "Qwen3_5MoeBackbone",
    OURS,
    tensor_parallel=True,
    hybrid=True,
    attention=qwen3_5.FAMILY.attention,
    moe={
        "Qwen3_5MoeSparseMoeBlock": MoERoute(
            moe_call, moe_spec, fused_gate_up_weights, fused_gate_up_variables
        )
    },
    state_layers=qwen3_5.STATE_LAYERS,
    text_forward=qwen3_5.text_forward,
    text_loop=qwen3_5.FAMILY.text_loop,
    parts="qwen3_5",
    image_architecture=architectures.MROPE,
)

"""What every route from a KerasHub MoE block to vLLM's fused MoE shares.

A route (one per MoE block class, in its family's module under `families/`)
replaces the block's `call` on the loaded backbone's instances (keras-hub's
classes are never modified). It runs the block's own router, or mirrors the
lines of its `call` that compute the routing (its logits, softmax, top-k and
normalisation), and then hands the experts, with the dense routing matrix
KerasHub's combine step uses, to `moe.fused_experts`. Whatever the block
adds around its experts (Qwen1.5's shared expert) stays KerasHub's layers. A
route also tells vLLM the block's sizes and activation (`spec`) and yields
its expert weights as vLLM's `FusedMoE` weight loader takes them
(`weights`). `moe_routes.py` installs them.
"""

import dataclasses
from collections.abc import Callable

import keras
from keras import ops

from vllm_keras_hub.layers.moe import moe


class MoERouteError(ValueError):
    """An MoE block that cannot be served on vLLM's fused MoE."""



@dataclasses.dataclass(frozen=True)
class MoERoute:
    """How one KerasHub MoE block class reaches vLLM's fused MoE.

    Args:
        call: Replaces the block's `call`, with its arguments.
        spec: `spec(block)` is the block's `moe.MoESpec`; raises
            `MoERouteError` for a block the kernel cannot compute exactly.
        weights: `weights(block, read)` yields `(param_name, shard_id,
            expert_id, tensor)` for `moe.load`, `read(variable)` giving a
            variable's stored value.
        variables: `variables(block)` lists the Keras variables holding the
            expert weights, never kept by Keras once loaded into vLLM.
        expert_scale: `expert_scale(block, read)` is a per-expert output
            factor, or `None`.
        prepare: `prepare(backbone, blocks)`, run at install before any
            `spec`, for what a block learns from elsewhere in the backbone.
    """

    call: Callable
    spec: Callable
    weights: Callable
    variables: Callable
    expert_scale: Callable = lambda block, read: None
    prepare: Callable = lambda backbone, blocks: None





def dense_routing(top_p, top_i, num_experts, dtype):
    # KerasHub's `routing_full`: each token's top-k weights at its chosen
    # experts, zero elsewhere, in the hidden states' dtype.
    one_hot = ops.cast(ops.one_hot(top_i, num_experts), top_p.dtype)
    return ops.cast(ops.sum(one_hot * top_p[..., None], axis=1), dtype)


def top_k_routing(block, x, normalize):
    # `Qwen3SparseMoeBlock.call`, `QwenSparseMoeBlock.call` and
    # `MixtralSparseMoeBlock.call` up to their combine step.
    router_logits = block._sparse_feedforward_gate_dense(x)
    router_probs = ops.softmax(router_logits, axis=-1)
    top_p, top_i = ops.top_k(router_probs, k=block.top_k)
    if normalize:
        top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
    return router_logits, dense_routing(top_p, top_i, block.num_experts, x.dtype)


def require_silu(block, experts):
    if experts.activation is not keras.activations.silu:
        raise MoERouteError(
            f"{block.name}: vllm-keras-hub serves SiLU-gated experts for this "
            f"family, but its experts use {experts.activation.__name__}."
        )


def silu_expert_bank_spec(block):
    # A block whose `expert_bank` gates with its `activation` (Qwen3-MoE,
    # Qwen1.5-MoE, Mixtral), which must be SiLU.
    require_silu(block, block.expert_bank)
    return moe.MoESpec(
        block.num_experts, block.top_k, block.hidden_dim, block.intermediate_dim, "silu"
    )


def gate_up_down_weights(variables, read):
    """Experts kept as separate `(E, H, I)` gate and up and `(E, I, H)` down
    kernels (`variables`), one expert at a time as vLLM's loader takes them."""
    gate, up, down = (read(v) for v in variables)
    for expert in range(gate.shape[0]):
        yield "w13_weight", "w1", expert, gate[expert].T
        yield "w13_weight", "w3", expert, up[expert].T
        yield "w2_weight", "w2", expert, down[expert].T


def fused_gate_up_weights(block, read):
    # Qwen3-MoE and Qwen1.5-MoE: one `(E, H, 2I)` kernel, gate then up.
    gate_up = read(block.expert_bank._expert_feedforward_gate_dense)
    down = read(block.expert_bank._expert_feedforward_output_dense)
    size = gate_up.shape[-1] // 2
    for expert in range(gate_up.shape[0]):
        yield "w13_weight", "w1", expert, gate_up[expert, :, :size].T
        yield "w13_weight", "w3", expert, gate_up[expert, :, size:].T
        yield "w2_weight", "w2", expert, down[expert].T


def fused_gate_up_variables(block):
    experts = block.expert_bank
    return [
        experts._expert_feedforward_gate_dense,
        experts._expert_feedforward_output_dense,
    ]

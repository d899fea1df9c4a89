"""Routes from KerasHub's MoE blocks to vLLM's fused MoE (`moe.py`).

Each route replaces one MoE block's `call` on the loaded backbone's
instances (keras-hub's classes are never modified). It runs the block's own
router, or mirrors the lines of its `call` that compute the routing (its
logits, softmax, top-k and normalisation), and then hands the experts, with
the dense routing matrix KerasHub's combine step uses, to
`moe.fused_experts`. Whatever the block adds around its experts (Qwen1.5's
shared expert) stays KerasHub's layers. A route also tells vLLM the block's
sizes and activation (`spec`) and yields its expert weights as vLLM's
`FusedMoE` weight loader takes them (`weights`).
"""

import dataclasses
import types
from collections.abc import Callable

import keras
import torch
from keras import ops

from vllm_keras_hub.layers import moe

# KerasHub's GPT-OSS experts: `(up + 1) * gate * sigmoid(alpha * gate)`, the
# gate clipped from above and the up projection both ways at `limit`. vLLM's
# `swigluoai` kernels have these constants built in.
_SWIGLUOAI = {"alpha": 1.702, "limit": 7.0}


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
    """

    call: Callable
    spec: Callable
    weights: Callable
    variables: Callable
    expert_scale: Callable = lambda block, read: None


def _dense_routing(top_p, top_i, num_experts, dtype):
    # KerasHub's `routing_full`: each token's top-k weights at its chosen
    # experts, zero elsewhere, in the hidden states' dtype.
    one_hot = ops.cast(ops.one_hot(top_i, num_experts), top_p.dtype)
    return ops.cast(ops.sum(one_hot * top_p[..., None], axis=1), dtype)


def _top_k_routing(block, x, normalize):
    # `Qwen3SparseMoeBlock.call`, `QwenSparseMoeBlock.call` and
    # `MixtralSparseMoeBlock.call` up to their combine step.
    router_logits = block._sparse_feedforward_gate_dense(x)
    router_probs = ops.softmax(router_logits, axis=-1)
    top_p, top_i = ops.top_k(router_probs, k=block.top_k)
    if normalize:
        top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
    return router_logits, _dense_routing(top_p, top_i, block.num_experts, x.dtype)


def _qwen3_moe_call(self, hidden_states, attention_mask=None, training=None):
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_logits, routing = _top_k_routing(self, x, self.norm_top_k_prob)
    out = moe.fused_experts(self, x, routing)
    return ops.reshape(out, shape), router_logits


def _qwen_moe_call(self, hidden_states, attention_mask=None, training=None):
    # Qwen1.5-MoE: plus a shared expert gated by a sigmoid, KerasHub's own
    # layers, computed first (vLLM may reuse the routed input's buffer).
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    shared = self.shared_expert_dense(x)
    shared *= ops.sigmoid(self.shared_expert_gate_dense(x))
    router_logits, routing = _top_k_routing(self, x, self.norm_top_k_prob)
    out = moe.fused_experts(self, x, routing) + shared
    return ops.reshape(out, shape), router_logits


def _qwen3_5_moe_call(self, hidden_states, attention_mask=None, training=None):
    # `Qwen3_5MoeSparseMoeBlock.call`: a sigmoid-gated shared expert (KerasHub's
    # own layers, computed first), softmax top-k routing always normalised.
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    shared = ops.sigmoid(self._shared_expert_gate(x)) * self.shared_expert(x)
    router_logits = self._router_gate(x)
    top_p, top_i = ops.top_k(ops.softmax(router_logits, axis=-1), k=self.top_k)
    top_p = top_p / ops.sum(top_p, axis=-1, keepdims=True)
    routing = _dense_routing(top_p, top_i, self.num_experts, x.dtype)
    out = moe.fused_experts(self, x, routing) + shared
    return ops.reshape(out, shape), router_logits


def _mixtral_call(self, hidden_states, attention_mask=None, training=False):
    # Router jitter applies in training only.
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_logits, routing = _top_k_routing(self, x, normalize=True)
    out = moe.fused_experts(self, x, routing)
    return ops.reshape(out, shape), router_logits


def _gpt_oss_call(self, hidden_states):
    # `GptOssTopKRouter` returns the dense matrix itself (a softmax over
    # each token's top-k logits).
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_scores = self.router(x)
    out = moe.fused_experts(self, x, router_scores)
    return ops.reshape(out, shape), router_scores


def _gemma4_call(self, x, dispatch_weights):
    # `Gemma4MoEBlock` is the expert bank alone; its decoder block's own
    # `Gemma4Router` computed `dispatch_weights`. `per_expert_scale` is
    # folded into the routing weights (`expert_scale`).
    return moe.fused_experts(self, x, ops.cast(dispatch_weights, x.dtype))


def _require_silu(block, experts):
    if experts.activation is not keras.activations.silu:
        raise MoERouteError(
            f"{block.name}: vllm-keras-hub serves SiLU-gated experts for this "
            f"family, but its experts use {experts.activation.__name__}."
        )


def _fused_gate_up_spec(block):
    # Qwen3-MoE and Qwen1.5-MoE: one `(E, H, 2I)` kernel, gate then up.
    _require_silu(block, block.expert_bank)
    return moe.MoESpec(
        block.num_experts, block.top_k, block.hidden_dim, block.intermediate_dim, "silu"
    )


def _qwen3_5_moe_spec(block):
    # `Qwen3_5MoeExperts.call` gates with SiLU, fixed (no `activation`).
    return moe.MoESpec(
        block.num_experts, block.top_k, block.hidden_dim, block.moe_intermediate_dim, "silu"
    )


def _fused_gate_up_weights(block, read):
    gate_up = read(block.expert_bank._expert_feedforward_gate_dense)
    down = read(block.expert_bank._expert_feedforward_output_dense)
    size = gate_up.shape[-1] // 2
    for expert in range(gate_up.shape[0]):
        yield "w13_weight", "w1", expert, gate_up[expert, :, :size].T
        yield "w13_weight", "w3", expert, gate_up[expert, :, size:].T
        yield "w2_weight", "w2", expert, down[expert].T


def _fused_gate_up_variables(block):
    experts = block.expert_bank
    return [
        experts._expert_feedforward_gate_dense,
        experts._expert_feedforward_output_dense,
    ]


def _mixtral_spec(block):
    _require_silu(block, block.expert_bank)
    return moe.MoESpec(
        block.num_experts, block.top_k, block.hidden_dim, block.intermediate_dim, "silu"
    )


def _mixtral_variables(block):
    experts = block.expert_bank
    return [
        experts._expert_feedforward_gate_dense,
        experts._expert_feedforward_intermediate_dense,
        experts._expert_feedforward_output_dense,
    ]


def _mixtral_weights(block, read):
    gate, up, down = (read(v) for v in _mixtral_variables(block))
    for expert in range(gate.shape[0]):
        yield "w13_weight", "w1", expert, gate[expert].T
        yield "w13_weight", "w3", expert, up[expert].T
        yield "w2_weight", "w2", expert, down[expert].T


def _gpt_oss_spec(block):
    from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts

    experts = block.experts
    constants = {"alpha": experts.alpha, "limit": experts.limit}
    if constants != _SWIGLUOAI:
        raise MoERouteError(
            f"{block.name}: vLLM's swigluoai expert kernels compute with "
            f"{_SWIGLUOAI}, but this block's experts use {constants}."
        )
    return moe.MoESpec(
        block.num_experts,
        block.top_k,
        block.hidden_dim,
        block.intermediate_dim,
        "swigluoai",
        has_bias=True,
        expert_weights_class=GptOssRoutedExperts,
    )


def _gpt_oss_variables(block):
    experts = block.experts
    return [
        experts.gate_up_proj,
        experts.gate_up_proj_bias,
        experts.down_proj,
        experts.down_proj_bias,
    ]


def _gpt_oss_weights(block, read):
    # Gate and up interleaved along the last axis, as `swigluoai` reads
    # them; vLLM's GPT-OSS loader takes each expert in this `(in, out)` form.
    gate_up, gate_up_bias, down, down_bias = (
        read(v) for v in _gpt_oss_variables(block)
    )
    for expert in range(gate_up.shape[0]):
        yield "w13_weight", "gpt_oss_w13", expert, gate_up[expert]
        yield "w13_bias", "gpt_oss_w13", expert, gate_up_bias[expert]
        yield "w2_weight", "gpt_oss_w2", expert, down[expert]
        yield "w2_bias", "gpt_oss_w2", expert, down_bias[expert]


def _gemma4_spec(block):
    # `Gemma4MoEBlock.call`: `gelu(gate, approximate=True) * up`.
    return moe.MoESpec(
        block.num_experts,
        block._gemma4_top_k,
        block.hidden_dim,
        block.expert_intermediate_dim,
        "gelu_tanh",
    )


def _gemma4_variables(block):
    return [block.gate_proj, block.up_proj, block.down_proj]


def _gemma4_weights(block, read):
    gate, up, down = (read(v) for v in _gemma4_variables(block))
    for expert in range(gate.shape[0]):
        yield "w13_weight", "w1", expert, gate[expert].T
        yield "w13_weight", "w3", expert, up[expert].T
        yield "w2_weight", "w2", expert, down[expert].T


def _gemma4_expert_scale(block, read):
    # KerasHub casts the scale to the compute dtype before multiplying.
    scale = read(block.per_expert_scale)
    return scale.to(getattr(torch, block.compute_dtype)).float()


# MoE block class name -> its route.
ROUTES = {
    "Qwen3SparseMoeBlock": MoERoute(
        _qwen3_moe_call,
        _fused_gate_up_spec,
        _fused_gate_up_weights,
        _fused_gate_up_variables,
    ),
    "QwenSparseMoeBlock": MoERoute(
        _qwen_moe_call,
        _fused_gate_up_spec,
        _fused_gate_up_weights,
        _fused_gate_up_variables,
    ),
    "Qwen3_5MoeSparseMoeBlock": MoERoute(
        _qwen3_5_moe_call,
        _qwen3_5_moe_spec,
        _fused_gate_up_weights,
        _fused_gate_up_variables,
    ),
    "MixtralSparseMoeBlock": MoERoute(
        _mixtral_call, _mixtral_spec, _mixtral_weights, _mixtral_variables
    ),
    "GptOssSparseMoeBlock": MoERoute(
        _gpt_oss_call, _gpt_oss_spec, _gpt_oss_weights, _gpt_oss_variables
    ),
    "Gemma4MoEBlock": MoERoute(
        _gemma4_call,
        _gemma4_spec,
        _gemma4_weights,
        _gemma4_variables,
        _gemma4_expert_scale,
    ),
}


def route_of(block):
    """The `MoERoute` of an installed block."""
    return ROUTES[type(block).__name__]


def _is_experts_layer(layer):
    # KerasHub 0.32 names every expert bank `...Experts` (Gemma4's
    # `Gemma4MoEBlock`) and every routed block `...SparseMoeBlock`.
    name = type(layer).__name__
    return name.endswith(("Experts", "SparseMoeBlock", "MoEBlock"))


def install(backbone, transformer_layers=None):
    """Routes every MoE block of `backbone` to vLLM's fused MoE.

    Args:
        backbone: The KerasHub backbone (its weights need not be loaded).
        transformer_layers: The layers whose blocks this rank serves (its
            pipeline stage's); all if `None`.

    Returns:
        The routed blocks of `transformer_layers`, in layer order.

    Raises:
        MoERouteError: an expert layer outside every routed block (its
            family's MoE has no route), or a block the kernel cannot
            compute exactly. Serving it KerasHub's way would compute every
            expert for every token.
    """
    layers = list(backbone._flatten_layers(include_self=False))
    blocks = [layer for layer in layers if type(layer).__name__ in ROUTES]
    covered = {
        id(sublayer)
        for block in blocks
        for sublayer in block._flatten_layers(include_self=True)
    }
    unrouted = sorted(
        {
            type(layer).__name__
            for layer in layers
            if _is_experts_layer(layer) and id(layer) not in covered
        }
    )
    if unrouted:
        raise MoERouteError(
            f"{type(backbone).__name__}'s expert layers {unrouted} have no "
            "route to vLLM's fused MoE. Routed MoE blocks: "
            f"{sorted(ROUTES)}."
        )
    _record_gemma4_top_k(backbone, blocks)
    for block in blocks:
        route_of(block).spec(block)
        block.call = types.MethodType(route_of(block).call, block)
    if transformer_layers is None:
        return blocks
    served = {
        id(sublayer)
        for layer in transformer_layers
        for sublayer in layer._flatten_layers(include_self=True)
    }
    return [block for block in blocks if id(block) in served]


def _record_gemma4_top_k(backbone, blocks):
    # Gemma4's expert bank does not know its top-k; its router does.
    banks = {id(block) for block in blocks if type(block).__name__ == "Gemma4MoEBlock"}
    if not banks:
        return
    for layer in backbone._flatten_layers(include_self=False):
        bank = getattr(layer, "moe_expert_bank", None)
        if bank is not None and id(bank) in banks:
            bank._gemma4_top_k = layer.moe_router.num_experts_per_token


def build_experts(blocks, prefix, dtype, weights):
    """A vLLM `FusedMoE` per routed block, holding the block's experts.

    The experts go from the preset into vLLM's weight loader, which keeps
    this rank's share; Keras never holds them. Call inside
    `set_current_vllm_config`.

    Args:
        blocks: The routed blocks this rank serves, from `install`.
        prefix: Name prefix of the `FusedMoE` layers, e.g. `"moe."`.
        dtype: The experts' torch dtype.
        weights: The backbone's `PresetWeights`.

    Returns:
        The `MoERunner`s, one per block; each block records its index.
    """
    from vllm.logger import init_logger

    runners = []
    for index, block in enumerate(blocks):
        route = route_of(block)
        runner = moe.build(
            route.spec(block),
            f"{prefix}{index}",
            dtype,
            expert_scale=route.expert_scale(block, weights.read),
        )
        moe.load(runner, route.weights(block, weights.read))
        weights.release(route.variables(block))
        block._vllm_moe_index = index
        runners.append(runner)
    if runners:
        init_logger(__name__).info(
            "%d KerasHub MoE blocks run on vLLM's fused MoE", len(runners)
        )
    return runners

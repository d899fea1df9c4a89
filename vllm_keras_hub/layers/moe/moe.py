"""KerasHub mixture-of-experts blocks on vLLM's fused-MoE layer.

KerasHub computes every expert for every token (one einsum over all
experts) and then weights the results by a one-hot of the router's top-k.
vLLM's own MoE models run `FusedMoE`, whose kernel computes only the
experts each token chose: on the CPU `cpu_fused_moe` over weights prepacked
at load (`CPUUnquantizedExperts`), elsewhere whatever vLLM picks for the
platform.

Each KerasHub MoE block keeps its own router, so its logits, top-k,
normalisation, biases and scales stay KerasHub's (`moe_routing.py`), and
hands its experts to one vLLM `FusedMoE` (`FusedMoEFactory`), built with
the block's sizes and activation. The two meet in the tensor KerasHub's own
combine step uses: the routing weights as a dense `(tokens, experts)`
matrix, zero for the experts a token does not use. It goes to vLLM's MoE
runner where router logits would, and the runner's routing function reads
the top-k back (`_chosen_experts`), so the dispatch, all-reduce and kernel
around it are vLLM's own, as they are for its models (expert and tensor
parallelism included, once the experts are loaded sharded).

The expert weights are loaded into the `FusedMoE` with vLLM's own weight
loader, one expert at a time, straight from the preset: Keras never holds
them, and each weight is held once, in the layout vLLM's kernel prepacks
at load.
"""

import dataclasses
import functools

import torch

from vllm_keras_hub.layers import step


@dataclasses.dataclass(frozen=True)
class MoESpec:
    """What one KerasHub MoE block asks of vLLM's `FusedMoE`.

    Args:
        num_experts: Experts in the block.
        top_k: Experts each token uses.
        hidden_size: The block's input and output width.
        intermediate_size: Each expert's hidden width.
        activation: vLLM's name of the experts' gated activation (`"silu"`,
            `"gelu_tanh"`, `"swigluoai"`).
        has_bias: Whether the experts' projections have biases.
        expert_weights_class: vLLM's `RoutedExperts` subclass whose weight
            loader takes the block's weights, or `None` for the default.
    """

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: str
    has_bias: bool = False
    expert_weights_class: type | None = None


# The attribute a routed MoE block keeps its experts in, as
# `experts(hidden_states, routing)`.
EXPERTS = "_vllm_experts"


class Served:
    """A block's `FusedMoE` runner, as a served step calls it.

    Args:
        runner: What `build` returned, loaded.
        index: The block's index among the model's routed blocks.
    """

    def __init__(self, runner, index):
        self.runner = runner
        self.index = index

    def __call__(self, hidden_states, routing):
        step.current().routed.moe.append(self.index)
        return self.runner(hidden_states, routing)


def fused_experts(block, hidden_states, routing):
    """The experts of `block` on `hidden_states`, combined by `routing`.

    Args:
        block: The KerasHub MoE block whose experts these are.
        hidden_states: `(tokens, hidden)` expert inputs.
        routing: `(tokens, experts)` routing weights, zero where a token
            does not use an expert.
    """
    experts = getattr(block, EXPERTS, None)
    if experts is None or step.current().routed is None:
        raise RuntimeError(
            f"{block.name}'s experts run on vLLM's fused MoE and Keras's copy "
            "of their weights is freed: the block runs only in a served step."
        )
    return experts(hidden_states, routing)


def _chosen_experts(
    hidden_states, gating_output, topk, renormalize, expert_scale=None
):
    # `gating_output` is the dense routing matrix: the top-k entries of each
    # row are the chosen experts and their weights (any zero weight is a
    # zero contribution, whichever expert it names).
    weights, ids = torch.topk(gating_output, topk, dim=-1)
    weights = weights.float()
    if expert_scale is not None:
        weights = weights * expert_scale[ids]
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def build(spec, prefix, dtype, expert_scale=None):
    """vLLM's `FusedMoE` for one block, empty until `load` fills it.

    Call inside `set_current_vllm_config`: the layer registers itself with
    the engine's compilation config under `prefix`.

    Args:
        spec: The block's `MoESpec`.
        prefix: The layer's name in vLLM's forward context.
        dtype: The experts' torch dtype (the model's).
        expert_scale: Optional `(experts,)` factor on each expert's output
            (Gemma4's `per_expert_scale`), folded into its routing weight as
            vLLM's own Gemma4 folds it.

    Returns:
        The `MoERunner`; called as `runner(hidden_states, routing)`.
    """
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    # With LoRA on, vLLM 0.32 gives every FusedMoE its Triton LoRA experts
    # kernel (`select_unquantized_moe_backend`: `moe_config.is_lora_enabled`),
    # which the CPU has not. KerasHub adapters never target the experts (the
    # LoRA manager leaves them unwrapped: `lora_linear.restrict_lora_manager`),
    # so they are built as with LoRA off.
    config = get_current_vllm_config()
    lora_config, config.lora_config = config.lora_config, None
    try:
        return _fused_moe(FusedMoEFactory, spec, prefix, dtype, expert_scale)
    finally:
        config.lora_config = lora_config


def _fused_moe(factory, spec, prefix, dtype, expert_scale):
    return factory(
        num_experts=spec.num_experts,
        top_k=spec.top_k,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        params_dtype=dtype,
        renormalize=False,
        custom_routing_function=functools.partial(
            _chosen_experts, expert_scale=expert_scale
        ),
        activation=spec.activation,
        has_bias=spec.has_bias,
        prefix=prefix,
        routed_experts_cls=spec.expert_weights_class,
    )


def load(runner, weights):
    """Fills `runner`'s experts with the block's weights.

    Args:
        runner: What `build` returned.
        weights: `(param_name, shard_id, expert_id, tensor)` per weight, as
            vLLM's `RoutedExperts.weight_loader` takes them (e.g.
            `("w13_weight", "w1", 3, gate)` with `gate` shaped `(out, in)`).
    """
    experts = runner.routed_experts
    for name, shard_id, expert_id, tensor in weights:
        param = getattr(experts, name)
        # Under expert parallelism the loader keeps only this rank's experts.
        param.weight_loader(
            param, tensor.to(param.dtype), name, shard_id=shard_id, expert_id=expert_id
        )

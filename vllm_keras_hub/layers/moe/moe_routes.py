"""Installs the MoE routes of `families/` onto a loaded backbone, and builds
the vLLM `FusedMoE` each routed block hands its experts to (`moe.py`).

What a route is: `moe_routing.py`.
"""

import types

from vllm_keras_hub import families
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import MoERouteError

# MoE block class name -> its `MoERoute`, from every family.
ROUTES = families.MOE_ROUTES


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
    for route in {id(route_of(block)): route_of(block) for block in blocks}.values():
        route.prepare(backbone, blocks)
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
        The `MoERunner`s, one per block, each bound to its block.
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
        setattr(block, moe.EXPERTS, moe.Served(runner, index))
        runners.append(runner)
    if runners:
        init_logger(__name__).info(
            "%d KerasHub MoE blocks run on vLLM's fused MoE", len(runners)
        )
    return runners

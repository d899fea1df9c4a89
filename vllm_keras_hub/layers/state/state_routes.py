"""Recurrent-state layers hand their tokens to vLLM's state cache: install and build.

A hybrid backbone (Qwen3.5) mixes attention layers with Gated DeltaNet
layers, which keep a per-request state instead of a KV cache. `install`
gives each GDN layer of the loaded backbone a route: while our model serves
a step (`step.scope(routed=...)`), the layer's `call` hands its hidden
states to the `GatedDeltaNetState` built for it and bound to it (`build`),
which keeps the layer's state in vLLM's state cache. Outside a served step
the layer runs its own `call`. Only the instances of one loaded backbone
get a route.
"""

import types

from vllm_keras_hub import families
from vllm_keras_hub.layers import step

# KerasHub layer classes that keep a recurrent state, not a KV cache.
STATE_LAYERS = families.STATE_LAYERS

# The attribute a routed state layer keeps its state layer in, as
# `state(layer, hidden_states)`.
STATE = "_vllm_state"


class Served:
    """A layer's `GatedDeltaNetState`, as a served step calls it.

    Args:
        state: The `GatedDeltaNetState`.
        index: Its index among the model's state layers.
    """

    def __init__(self, state, index):
        self.state = state
        self.index = index

    def __call__(self, layer, hidden_states):
        step.current().routed.states.append(self.index)
        return self.state(layer, hidden_states)


def serving():
    """Whether a served step (or the start-up probe) is routing GDN layers."""
    return step.current().routed is not None


def gated_delta_net(layer, hidden_states):
    """The GDN layer `layer`'s output on `(num_tokens, 1, hidden)` tokens."""
    return getattr(layer, STATE)(layer, hidden_states)


def state_layer(transformer_layer):
    """The sublayer of `transformer_layer` keeping a recurrent state, or `None`."""
    found = [
        layer
        for layer in transformer_layer._flatten_layers(include_self=False)
        if type(layer).__name__ in STATE_LAYERS
    ]
    if len(found) > 1:
        raise ValueError(
            f"{transformer_layer.name} has {len(found)} recurrent-state layers; "
            "vllm-keras-hub maps at most one per transformer layer."
        )
    return found[0] if found else None


def _routed_call(self, hidden_states, *args, **kwargs):
    """The layer's `call`, handing its tokens to vLLM while a step is served.

    The served step feeds no cache: the state lives in vLLM's state cache,
    and the padding mask of vLLM's packed one-token rows is all ones.
    """
    if serving():
        return gated_delta_net(self, hidden_states)
    return type(self).call(self, hidden_states, *args, **kwargs)


def install(transformer_layers):
    """Routes the recurrent-state layers among `transformer_layers`.

    Args:
        transformer_layers: The backbone's transformer layers (a pipeline
            stage's, or all).

    Returns:
        `(index, layer)` for each state layer, `index` the position of its
        transformer layer in `transformer_layers`, in order.
    """
    routed = []
    for index, block in enumerate(transformer_layers):
        layer = state_layer(block)
        if layer is None:
            continue
        layer.call = types.MethodType(_routed_call, layer)
        routed.append((index, layer))
    return routed


def build(routed, prefix, dtype, first_index=0):
    """One `GatedDeltaNetState` per routed layer, registered with the engine.

    Call inside `set_current_vllm_config`. Each is named `{prefix}{index}`,
    `index` its layer's index in the backbone, so vLLM orders state and KV
    caches by layer.

    Args:
        routed: What `install` returned.
        prefix: The state layers' name prefix, e.g. `"state."`.
        dtype: The model's torch dtype.
        first_index: The backbone's index of the first transformer layer
            `install` was given.

    Returns:
        The `GatedDeltaNetState`s, in the order of `routed`, each bound to
        its layer.
    """
    from vllm.logger import init_logger

    from vllm_keras_hub.layers.state import state

    states = []
    reasons = set()
    for index, layer in routed:
        spec = state.GatedDeltaNetSpec.of(layer)
        kernels, reason = state.vllm_kernels_apply(spec, dtype)
        reasons.add(reason)
        built = state.GatedDeltaNetState(
            layer, f"{prefix}{first_index + index}", dtype, kernels
        )
        setattr(layer, STATE, Served(built, len(states)))
        states.append(built)
    if states:
        logger = init_logger(__name__)
        if all(s.vllm_kernels for s in states):
            logger.info("%d Gated DeltaNet layers run on vLLM's CPU GDN kernels", len(states))
        else:
            logger.info(
                "%d Gated DeltaNet layers run KerasHub's own recurrence over "
                "vLLM's state cache: %s",
                len(states),
                "; ".join(sorted(r for r in reasons if r)),
            )
    return states

"""Attention layers hand their q/k/v to vLLM: the install and dispatch.

keras-hub 0.32 ships a serving route (`_compute_vllm_attention`, reached from
a context check at the top of `call`) in 8 families' attention layers. For
the others, `install` gives the loaded backbone's attention layers the same
kind of route (each family's `Family.attention`, under `families/`), so the
rest of the serving path is shared. Only the instances of one loaded
backbone get a route; keras-hub's classes are never modified.
"""

import functools
import types

from keras import ops
from keras_hub.src.vllm.context import get_vllm_context

from vllm_keras_hub import families
from vllm_keras_hub.families.family import KERAS_HUB
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import OUTPUT_AND_CACHE
from vllm_keras_hub.layers.attention.attention_routes import OUTPUT_WEIGHTS_AND_CACHE
from vllm_keras_hub.layers.state import state_routes


def transformer_layers(backbone):
    """The backbone's transformer layers, one attention layer each.

    Gemma3n keeps them in its text model (`language_model`), not on the
    backbone; ALBERT in groups (lists), each group called again and again.

    Raises:
        ValueError: the backbone has none.
    """
    for owner in (backbone, getattr(backbone, "language_model", None)):
        layers = getattr(owner, "transformer_layers", None)
        if layers is not None:
            return [
                layer
                for entry in layers
                for layer in (entry if isinstance(entry, list) else [entry])
            ]
    raise ValueError(
        f"{type(backbone).__name__} has no `transformer_layers`; "
        "vllm-keras-hub cannot map its attention to vLLM."
    )


def token_embedding(backbone):
    """The backbone's token embedding, also its (tied) output projection.

    Gemma3n's is its text model's `token_embedding` (embedding scale and
    final logit soft cap included); `backbone.token_embedding` is `None`.
    """
    if backbone.token_embedding is not None:
        return backbone.token_embedding
    return backbone.language_model.token_embedding


# Attention-layer class name -> its `Route`, from every family.
ROUTES = families.ATTENTION_ROUTES


def _compute_vllm_attention(self, route, hidden_states, cache, vllm_context):
    """The route every installed layer takes while vLLM serves: `route`,
    bound at install.

    Named as keras-hub's own routes are, which the start-up probe wraps.
    """
    positions = ops.reshape(vllm_context.positions, (-1, 1))
    output = route.forward(self, hidden_states, positions)
    if route.returns == OUTPUT_WEIGHTS_AND_CACHE:
        return output, None, cache
    if cache is not None or route.returns == OUTPUT_AND_CACHE:
        return output, cache
    return output


def _routed_call(self, *args, **kwargs):
    """The layer's `call`, going to vLLM while a serving context is active.

    Keras binds `__call__`'s arguments against `_call_signature`, taken from
    the class's `call` when the layer was built, so the arguments arrive
    here exactly as the class's `call` would receive them.
    """
    context = get_vllm_context()
    if context is not None and context.paged_attention_func is not None:
        arguments = self._call_signature.bind(*args, **kwargs).arguments
        hidden_states = next(iter(arguments.values()))
        # SmolLM3 takes its cache as `self_attention_cache` in `**kwargs`.
        cache = arguments.get("cache")
        if cache is None:
            cache = arguments.get("kwargs", {}).get("self_attention_cache")
        return self._compute_vllm_attention(hidden_states, cache, context)
    return type(self).call(self, *args, **kwargs)


def routing_layers(transformer_layers):
    """Every sublayer of `transformer_layers` with a route to vLLM, in
    order: ours, once installed, or keras-hub's own."""
    return [
        layer
        for transformer_layer in transformer_layers
        for layer in transformer_layer._flatten_layers(include_self=False)
        if hasattr(layer, "_compute_vllm_attention")
    ]


def _attention_layer(transformer_layer):
    """The one sublayer of `transformer_layer` that has a route in `ROUTES`.

    `None` for a transformer layer whose token mixer keeps a recurrent
    state instead (`state_routes.py`).
    """
    found = [
        layer
        for layer in transformer_layer._flatten_layers(include_self=False)
        if type(layer).__name__ in ROUTES
    ]
    if not found and state_routes.state_layer(transformer_layer) is not None:
        return None
    if len(found) != 1:
        raise ValueError(
            f"Expected one attention layer with a route to vLLM in "
            f"{transformer_layer.name}, found "
            f"{[type(layer).__name__ for layer in found]}."
        )
    return found[0]


def attention_indices(transformer_layers):
    """Indices of the layers among `transformer_layers` that attend."""
    return [
        index
        for index, block in enumerate(transformer_layers)
        if state_routes.state_layer(block) is None
    ]


def install(backbone, family, kv_sharing_targets=None):
    """Gives `backbone`'s attention layers a vLLM route, where ours is needed.

    Args:
        backbone: The loaded KerasHub backbone.
        family: Its `families.Family`; `family.route` says whose route it
            uses: `"keras_hub"` (keras-hub's own, nothing to install) or
            `"vllm_keras_hub"` (ours).
        kv_sharing_targets: Per layer, what it reads the K/V of instead of
            computing its own (`None`: its own), over the route's: a
            drafter's layers read another model's cache.
    """
    if family.route == KERAS_HUB:
        return
    if family.route != OURS:
        raise ValueError(f"{family.display_name} has no route to install.")
    blocks = transformer_layers(backbone)
    layers = [_attention_layer(block) for block in blocks]
    targets = [None] * len(layers)
    first = next(layer for layer in layers if layer is not None)
    if kv_sharing_targets is not None:
        targets = list(kv_sharing_targets)
    elif ROUTES[type(first).__name__].kv_sharing_targets is not None:
        targets = ROUTES[type(first).__name__].kv_sharing_targets(backbone)
    for transformer_layer, layer, target in zip(blocks, layers, targets, strict=True):
        if layer is None:
            continue
        route = ROUTES[type(layer).__name__]
        layer._vllm_kv_sharing_target = target
        if route.alibi_slopes is not None:
            layer._vllm_alibi_slopes = tuple(
                float(slope) for slope in route.alibi_slopes(transformer_layer, layer)
            )
        if route.sliding_window is not None:
            layer._vllm_sliding_window = route.sliding_window(transformer_layer, layer)
        layer._compute_vllm_attention = functools.partial(
            _compute_vllm_attention, layer, route
        )
        layer.call = types.MethodType(_routed_call, layer)


def build(specs, prefix, cache_config, indices, encoder_only=False, target_names=None):
    """One vLLM `Attention` per attending transformer layer, from the probe's specs.

    Call inside `set_current_vllm_config`: each registers itself with the
    engine under `{prefix}{index}`, `index` the layer's index in the
    backbone, and vLLM orders KV caches by that index.

    Args:
        specs: The probe's `AttentionSpec` per attending transformer layer
            of this pipeline stage.
        prefix: The layers' name prefix, e.g. `"attention."`.
        cache_config: The engine's `CacheConfig`.
        indices: The backbone's index of each spec's layer.
        encoder_only: Whether every token attends to its whole sequence
            (vLLM's `EncoderOnlyAttention`, which keeps no KV cache).
        target_names: Per spec, the vLLM name of the layer whose cache it
            reads, over `{prefix}{spec.kv_sharing_target}`: another model's.

    Raises:
        ValueError: a head size the platform's attention kernel cannot run
            (it would fail at the first request, not here).
    """
    import torch
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention.encoder_only_attention import (
        EncoderOnlyAttention,
    )

    kind = EncoderOnlyAttention if encoder_only else Attention
    layers = []
    if target_names is None:
        target_names = [
            None if spec.kv_sharing_target is None else f"{prefix}{spec.kv_sharing_target}"
            for spec in specs
        ]
    for index, spec, target_name in zip(indices, specs, target_names, strict=True):
        layer = kind(
            spec.num_heads,
            spec.head_size,
            spec.scale,
            num_kv_heads=spec.num_kv_heads,
            cache_config=cache_config,
            logits_soft_cap=spec.soft_cap,
            per_layer_sliding_window=spec.sliding_window,
            alibi_slopes=None if spec.alibi_slopes is None else list(spec.alibi_slopes),
            prefix=f"{prefix}{index}",
            kv_sharing_target_layer_name=target_name,
            # Only where used: not every backend's impl takes `sinks`.
            **(
                {}
                if spec.sinks is None
                else {"sinks": torch.tensor(spec.sinks, dtype=torch.float32)}
            ),
        )
        backend = layer.attn_backend
        if not backend.supports_head_size(spec.head_size):
            raise ValueError(
                f"Transformer layer {index} has attention heads of size "
                f"{spec.head_size}, which this platform's attention kernel "
                f"({backend.get_name()}) cannot run; it runs head sizes "
                f"{backend.get_supported_head_sizes()}."
            )
        layers.append(layer)
    return layers

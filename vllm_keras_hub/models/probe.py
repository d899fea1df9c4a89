"""The start-up probe: one token through the backbone, recording the routes.

Every routed attention layer hands its kernel (directly, or through
keras-hub's bridge) its heads, scale, sliding window, soft cap and other
options; every routed MoE block hands its experts their tokens, every
recurrent-state layer its state. The probe runs one token with recorders
bound in their kernels' place, so what vLLM must build
(one `Attention` per transformer layer, one `FusedMoE` per MoE block) is
read from the layers themselves, and a layer that does not route fails
start-up, naming it.
"""

import collections
import contextlib
import dataclasses

import torch

from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention.attention import attention_indices
from vllm_keras_hub.layers.attention.attention import routing_layers
from vllm_keras_hub.layers.attention.paged_attention import ATTENTION
from vllm_keras_hub.layers.attention.paged_attention import serving
from vllm_keras_hub.layers.moe.moe import EXPERTS
from vllm_keras_hub.layers.state.state_routes import STATE


class RouteError(RuntimeError):
    """Layers that did not hand their work to vLLM exactly once."""


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What one KerasHub attention layer asks of vLLM's `Attention`.

    Args:
        num_heads: Query heads.
        head_size: Per-head size.
        num_kv_heads: Key/value heads, unexpanded.
        scale: Softmax scale.
        sliding_window: Tokens each query sees, itself included, or `None`.
        soft_cap: Attention-logit soft cap, or `None`.
        alibi_slopes: Per-query-head ALiBi slopes, added after the softmax
            scale as `slope * (key_position - query_position)`, or `None`.
        sinks: Per-query-head learned attention-sink logits, each an extra
            softmax column with no value (GPT-OSS), or `None`.
        kv_sharing_target: Index of the earlier layer whose keys and values
            this layer attends over, with no cache of its own (Gemma3n and
            Gemma4's last `num_kv_shared_layers`), or `None`.
    """

    num_heads: int
    head_size: int
    num_kv_heads: int
    scale: float
    sliding_window: int | None
    soft_cap: float | None
    alibi_slopes: tuple[float, ...] | None = None
    sinks: tuple[float, ...] | None = None
    kv_sharing_target: int | None = None


@dataclasses.dataclass
class Probe:
    """What one probe step recorded.

    Args:
        specs: An `AttentionSpec` per transformer layer.
        attention_layers: The KerasHub attention layer that routed for each.
        moe_blocks: The MoE blocks that handed their experts to vLLM, in
            call order.
        state_layers: The recurrent-state layers that handed their tokens
            to their state layer, in call order.
        caller: The attention layer whose route is running, as it names
            itself (`_announced`).
    """

    specs: list
    attention_layers: list
    moe_blocks: list
    state_layers: list = dataclasses.field(default_factory=list)
    caller: object = None

    def first_calls(self):
        """Keeps each attention layer's first call only: one vLLM layer
        serves a layer the backbone calls again (`Family.layer_calls`)."""
        seen, specs, layers = set(), [], []
        for spec, layer in zip(self.specs, self.attention_layers, strict=True):
            if id(layer) not in seen:
                seen.add(id(layer))
                specs.append(spec)
                layers.append(layer)
        self.specs, self.attention_layers = specs, layers


_MISSING = object()


@contextlib.contextmanager
def _bound(bindings):
    """Sets each `(owner, name, value)` inside the block, then restores it."""
    held = [(owner, name, vars(owner).get(name, _MISSING)) for owner, name, _ in bindings]
    for owner, name, value in bindings:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in held:
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _announced(probe, layer):
    # keras-hub's bridge hands its paged-attention function tensors and
    # options, not the layer: for the probe step, each layer's route first
    # names its layer.
    compute = layer._compute_vllm_attention

    def announce(*args, **kwargs):
        probe.caller = layer
        return compute(*args, **kwargs)

    return announce


def run(stage, moe_blocks=(), state_layers=()):
    """Runs one token through a pipeline stage, recording each route's options.

    For its one step, recorders stand in for every routed layer's kernel:
    each attention layer's (`paged_attention.ATTENTION`, and what
    keras-hub's bridge hands out), `moe_blocks`' experts and
    `state_layers`' states. Kernels already bound are restored after.

    Args:
        stage: A `pipeline.Stage` of a loaded backbone (the whole backbone
            where there is one stage).
        moe_blocks: The stage's routed MoE blocks (`moe_routes.install`).
        state_layers: `(index, layer)` of its recurrent-state layers
            (`state_routes.install`).

    Returns:
        A `Probe`.
    """
    layers = stage.layers
    probe = Probe([], [], [])

    def record_attention(
        query,
        key,
        value,
        scale,
        head_size,
        num_heads,
        num_kv_heads,
        sliding_window=None,
        soft_cap=None,
        alibi_slopes=None,
        sinks=None,
        kv_sharing_target=None,
    ):
        probe.attention_layers.append(probe.caller)
        probe.caller = None
        probe.specs.append(
            AttentionSpec(
                num_heads=int(num_heads),
                head_size=int(head_size),
                num_kv_heads=int(num_kv_heads),
                scale=float(scale),
                sliding_window=int(sliding_window) if sliding_window else None,
                soft_cap=float(soft_cap) if soft_cap else None,
                alibi_slopes=(
                    None
                    if alibi_slopes is None
                    else tuple(float(slope) for slope in alibi_slopes)
                ),
                sinks=(
                    None
                    if sinks is None
                    else tuple(torch.as_tensor(sinks).float().flatten().tolist())
                ),
                kv_sharing_target=kv_sharing_target,
            )
        )
        return torch.zeros_like(query)

    def record_experts(block):
        def record(hidden_states, routing):
            probe.moe_blocks.append(block)
            return torch.zeros_like(hidden_states)

        return record

    def record_state(layer, hidden_states):
        probe.state_layers.append(layer)
        return torch.zeros_like(hidden_states)

    attending = routing_layers(layers)
    bindings = [(layer, ATTENTION, record_attention) for layer in attending]
    bindings += [
        (layer, "_compute_vllm_attention", _announced(probe, layer))
        for layer in attending
    ]
    bindings += [(block, EXPERTS, record_experts(block)) for block in moe_blocks]
    bindings += [(layer, STATE, record_state) for _, layer in state_layers]
    input_ids = torch.zeros(1, dtype=torch.int64)
    hidden = None if stage.first else torch.zeros(1, stage.hidden_size)
    with (
        torch.inference_mode(),
        _bound(bindings),
        step.scope(routed=step.Routed()),
        serving([record_attention] * len(attending), torch.zeros_like(input_ids)),
    ):
        stage.packed_forward(input_ids, torch.zeros_like(input_ids), hidden)
    return probe


def _layer_owners(layers):
    """Maps `id()` of every sublayer to its transformer layer's index."""
    owners = {}
    for index, layer in enumerate(layers):
        for sublayer in layer._flatten_layers(include_self=True):
            owners[id(sublayer)] = index
    return owners


def check_attention_routes(probe, layers, name, calls=None):
    """Raises `RouteError` unless the attending layers each routed once, in order.

    Layers whose token mixer keeps a recurrent state have no attention
    (`check_state_routes`).

    Args:
        probe: What `run` recorded.
        layers: The probed stage's transformer layers.
        name: The model, for the message.
        calls: The layers' indices in the order the backbone calls them,
            where it calls some more than once (`Family.layer_calls`).
    """
    owners = _layer_owners(layers)
    routed = [owners.get(id(caller)) for caller in probe.attention_layers]
    expected = attention_indices(layers)
    if calls is not None:
        attending = set(expected)
        expected = [index for index in calls if index in attending]
    if routed == expected:
        return
    missing = [i for i in expected if i not in routed]
    unexpected = [i for i in routed if i is not None and i not in expected]
    repeated = sorted(
        {i for i in routed if i is not None and routed.count(i) > max(expected.count(i), 1)}
    )
    problems = []
    if missing:
        problems.append("did not route: " + ", ".join(layers[i].name for i in missing))
    if repeated:
        problems.append(
            "routed more than once: " + ", ".join(layers[i].name for i in repeated)
        )
    if unexpected:
        problems.append(
            "attended where a recurrent state is kept: "
            + ", ".join(layers[i].name for i in unexpected)
        )
    if None in routed or not problems:
        problems.append(f"dispatch order was {routed}")
    raise RouteError(
        f"{name}: {len(expected)} transformer layers must each hand attention "
        f"to vLLM exactly once, in order, but some "
        + "; ".join(problems)
        + ". Serving them would give wrong output."
    )


def check_state_routes(probe, routed, name):
    """Raises `RouteError` unless each state layer handed its tokens once, in order.

    Args:
        probe: What `run` recorded.
        routed: What `state_routes.install` returned.
        name: The model, for the message.
    """
    layers = [layer for _, layer in routed]
    if [id(layer) for layer in probe.state_layers] == [id(layer) for layer in layers]:
        return
    raise RouteError(
        f"{name}: each of {len(layers)} Gated DeltaNet layers must hand its "
        f"tokens to its vLLM state layer exactly once, in order, but "
        f"{[layer.name for layer in probe.state_layers]} did. Serving it "
        "would give wrong output."
    )


def check_moe_routes(probe, blocks, name):
    """Raises `RouteError` unless each MoE block handed its experts once.

    Args:
        probe: What `run` recorded.
        blocks: The blocks `moe_routes.install` routed.
        name: The model, for the message.
    """
    counts = collections.Counter(id(block) for block in probe.moe_blocks)
    wrong = [block.name for block in blocks if counts[id(block)] != 1]
    unknown = len(probe.moe_blocks) - sum(counts[id(block)] for block in blocks)
    if not wrong and not unknown:
        return
    raise RouteError(
        f"{name}: each of {len(blocks)} MoE blocks must hand its experts to "
        f"vLLM's fused MoE exactly once, but {wrong or 'a block not routed'} "
        "did not. Serving it would give wrong output."
    )


def check_kv_sharing(specs, indices=None):
    """Raises `RouteError` unless each KV-sharing layer fits its target's cache.

    vLLM hands the sharing layer its target's cache as is: it must be an
    earlier layer of the same pipeline stage with the same KV heads and head
    size.

    Args:
        specs: The probe's `AttentionSpec` per attending layer.
        indices: The backbone's index of each spec's layer (default: the
            positions, a whole model's).
    """
    by_index = dict(zip(range(len(specs)) if indices is None else indices, specs))
    for index, spec in by_index.items():
        target = spec.kv_sharing_target
        if target is None:
            continue
        if (
            not target < index
            or target not in by_index
            or by_index[target].kv_sharing_target is not None
        ):
            raise RouteError(
                f"Layer {index} shares the K/V of layer {target}, which is not "
                "an earlier layer with a cache of its own."
            )
        mine = (spec.num_kv_heads, spec.head_size)
        theirs = (by_index[target].num_kv_heads, by_index[target].head_size)
        if mine != theirs:
            raise RouteError(
                f"Layer {index} reads the K/V of layer {target} as "
                f"{mine[0]} heads of {mine[1]}, but that layer caches "
                f"{theirs[0]} heads of {theirs[1]}."
            )


def check_step(name, attention_indices, moe_indices, state_indices, counts, attention_calls=None):
    """Raises for a served step that routed otherwise than the probe.

    A layer that fell back to its own attention must not return; under
    torch.compile this is decided once, while tracing. Each kernel carries
    its layer's index, so each attending layer, MoE block and state layer
    must route exactly once, in order (keras-hub's own routes get the n-th
    kernel from its bridge; the probe checked them by layer).

    Args:
        name: The model, for the message.
        attention_indices: The index of each attending layer routed, in
            call order.
        moe_indices: The index of each MoE block routed, in call order.
        state_indices: The index of each state layer routed, in order.
        counts: `(attention, moe, states)`: the vLLM layers built.
        attention_calls: The attention kernels' indices in call order,
            where the backbone calls a layer more than once.
    """
    attention, moe, states = counts
    if attention_indices != (attention_calls or list(range(attention))):
        raise RouteError(
            f"{name}: {len(attention_indices)} of {attention} transformer "
            "layers handed attention to vLLM in this step, not one per layer "
            "in order; serving it would give wrong output."
        )
    if moe_indices != list(range(moe)):
        raise RouteError(
            f"{name}: {len(moe_indices)} expert calls to vLLM in this step for "
            f"{moe} MoE blocks, not one per block in order; serving it would "
            "give wrong output."
        )
    if state_indices != list(range(states)):
        raise RouteError(
            f"{name}: {len(state_indices)} state-layer calls to vLLM in this "
            f"step for {states} Gated DeltaNet layers, not one per layer in "
            "order; serving it would give wrong output."
        )

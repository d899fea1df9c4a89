import contextlib

import keras
import keras_hub
import numpy as np
import pytest
import torch

from vllm_keras_hub import families
from vllm_keras_hub.families import phi3
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention import attention
from vllm_keras_hub.layers.attention import paged_attention as paged
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.layers.state import state_routes
from vllm_keras_hub.testing.presets import backbone_kwargs
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import WINDOW

OUR_BACKBONES = {
    family.backbone for family in families.FAMILIES if family.route == "vllm_keras_hub"
}
OUR_FAMILIES = sorted(
    name for name, (_, backbone, _) in TINY_FAMILIES.items() if backbone in OUR_BACKBONES
)
NUM_TOKENS = 3 * WINDOW


def family_of(family):
    return families.family_for_backbone(TINY_FAMILIES[family][1])


def tiny_backbone(family, seed=0):
    _, backbone_name, _ = TINY_FAMILIES[family]
    keras.utils.set_random_seed(seed)
    return getattr(keras_hub.models, backbone_name)(**backbone_kwargs(family, 64))


def stand_in_kernels(layers, paged_attention):
    """A kernel per attending layer of `layers`, answered by `paged_attention`.

    `paged_attention` is called as keras-hub's bridge calls its function,
    with a cache `(store, index)` per layer, `index` its call order: a K/V
    store shared by the layers, for `reference_attention`.
    """
    store = {}

    def kernel(index):
        def attend(query, key, value, *args, **kwargs):
            return paged_attention((store, index), query, key, value, *args, **kwargs)[1]

        return attend

    return [kernel(index) for index in range(len(attention.routing_layers(layers)))]


@contextlib.contextmanager
def serving_step(backbone, paged_attention, num_tokens):
    """A serving step's context, attention answered by `paged_attention`.

    Each attending layer holds its stand-in kernel (keras-hub's own routes
    reach it through its bridge); a hybrid backbone's Gated DeltaNet layers
    run their own `call` on the sequence.
    """
    layers = transformer_layers(backbone)
    kernels = stand_in_kernels(layers, paged_attention)
    paged.bind(attention.routing_layers(layers), kernels)
    for _, layer in state_routes.install(layers):
        setattr(layer, state_routes.STATE, whole_sequence_state)
    with paged.serving(kernels, torch.arange(num_tokens)), step.scope(
        routed=step.Routed()
    ):
        yield


def reference_attention(
    cache,
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
    """Causal attention over one sequence, as vLLM's kernel computes it.

    With `cache` from `kv_caches`, each layer's K/V are kept, and a
    KV-sharing layer attends over its target's instead of its own.
    """
    if cache is not None:
        store, index = cache
        if kv_sharing_target is None:
            store[index] = (key, value)
        else:
            key, value = store[kv_sharing_target]
    num_tokens = query.shape[0]
    query = query.reshape(num_tokens, num_heads, head_size)
    key = key.reshape(num_tokens, num_kv_heads, head_size)
    value = value.reshape(num_tokens, num_kv_heads, head_size)
    groups = num_heads // num_kv_heads
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, key) * scale
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    i = torch.arange(num_tokens)[:, None]
    j = torch.arange(num_tokens)[None, :]
    if alibi_slopes is not None:
        slopes = torch.tensor(alibi_slopes, dtype=scores.dtype)[:, None, None]
        scores = scores + slopes * (j - i)
    visible = j <= i
    if sliding_window:
        visible &= j > i - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        # One more softmax column per head, with no value.
        sink = torch.as_tensor(sinks, dtype=scores.dtype)[:, None, None]
        scores = torch.cat([scores, sink.expand(-1, num_tokens, 1)], dim=-1)
    weights = scores.softmax(-1)[..., :num_tokens]
    output = torch.einsum("hqk,khd->qhd", weights, value)
    return cache, output.reshape(num_tokens, num_heads * head_size)


def hidden_states(backbone, token_ids, positions=None):
    inputs = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    if "position_ids" in {t.name for t in keras.tree.flatten(backbone.input)}:
        if positions is None:
            positions = np.broadcast_to(np.arange(token_ids.shape[1]), token_ids.shape)
        inputs["position_ids"] = positions
    with torch.inference_mode():
        return keras.ops.convert_to_numpy(backbone(inputs, training=False))


def whole_sequence_state(layer, hidden_states):
    """A Gated DeltaNet layer's own `call` on one request's packed rows."""
    rows = hidden_states.shape
    output = type(layer).call(layer, hidden_states.reshape(1, rows[0], rows[-1]))
    return output.reshape(rows)


def served_hidden_states(backbone, paged_attention, token_ids=None):
    """One serving step with attention answered by `paged_attention`.

    The tokens (default `1..NUM_TOKENS`) are fed one per row at positions
    `0..`, as the serving model feeds vLLM's packed tokens. A hybrid
    backbone's Gated DeltaNet layers run their own `call` on the sequence.
    """
    if token_ids is None:
        token_ids = np.arange(1, NUM_TOKENS + 1)
    num_tokens = len(token_ids)
    with serving_step(backbone, paged_attention, num_tokens):
        return hidden_states(
            backbone, np.asarray(token_ids)[:, None], np.arange(num_tokens)[:, None]
        )


@pytest.mark.parametrize("family", OUR_FAMILIES)
def test_route_equals_the_layers_own_attention(family):
    backbone = tiny_backbone(family)
    attention.install(backbone, family_of(family))
    token_ids = np.random.default_rng(0).integers(1, 64, (1, NUM_TOKENS))
    expected = hidden_states(backbone, token_ids)[0]
    routed = served_hidden_states(backbone, reference_attention, token_ids[0])[:, 0]
    np.testing.assert_allclose(routed, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", OUR_FAMILIES)
def test_install_routes_these_instances_only(family):
    backbone = tiny_backbone(family)
    other = tiny_backbone(family)
    token_ids = np.arange(1, 11)[None]
    before = hidden_states(backbone, token_ids)
    attention.install(backbone, family_of(family))
    attention_layers = [
        attention._attention_layer(transformer_layers(backbone)[i])
        for i in attention.attention_indices(transformer_layers(backbone))
    ]
    assert attention_layers
    assert all("call" in vars(layer) for layer in attention_layers)
    assert all("_compute_vllm_attention" in vars(layer) for layer in attention_layers)
    for layer in transformer_layers(other):
        assert "call" not in vars(attention._attention_layer(layer) or layer)
    # Outside a serving context the layers run their own code unchanged.
    np.testing.assert_array_equal(hidden_states(backbone, token_ids), before)


def test_keras_hub_route_installs_nothing():
    backbone = tiny_backbone("mistral")
    attention.install(backbone, families.family_by_name("mistral"))
    for layer in backbone.transformer_layers:
        assert "call" not in vars(layer._self_attention_layer)


@pytest.mark.parametrize("family", ["qwen", "qwen3", "qwen3_moe"])
def test_qwen_routes_drop_the_window_as_keras_hub_does(family):
    # KerasHub bug: Qwen(3)(Moe)Attention applies `sliding_window_size` only on
    # its non-fused path, so on torch `generate()` attends to everything. If
    # this starts failing, KerasHub fixed it and the route should pass the
    # window again.
    backbone = tiny_backbone(family)
    token_ids = np.arange(1, NUM_TOKENS + 1)[None]
    windowed = hidden_states(backbone, token_ids)
    attention_layers = [
        attention._attention_layer(layer) for layer in backbone.transformer_layers
    ]
    for layer in attention_layers:
        assert layer.sliding_window_size == WINDOW
        layer.sliding_window_size = None
    np.testing.assert_array_equal(hidden_states(backbone, token_ids), windowed)
    for layer in attention_layers:
        layer.sliding_window_size = WINDOW

    windows = []

    def record(*args, sliding_window=None, **kwargs):
        windows.append(sliding_window)
        return reference_attention(*args, sliding_window=sliding_window, **kwargs)

    attention.install(backbone, family_of(family))
    served_hidden_states(backbone, record)
    assert windows == [None, None]


@pytest.mark.parametrize("fused", [False, True])
def test_qwen_moe_windows_where_keras_hub_does(fused, monkeypatch):
    # `QwenMoeAttention` applies its window on its non-fused path only, which
    # it takes on the CPU; on most GPUs it takes the fused one.
    from keras_hub.src.models.qwen_moe.qwen_moe_attention import QwenMoeAttention

    monkeypatch.setattr(QwenMoeAttention, "_use_fused_attention_op", lambda self: fused)
    backbone = tiny_backbone("qwen_moe")
    windows = []

    def record(*args, sliding_window=None, **kwargs):
        windows.append(sliding_window)
        return reference_attention(*args, sliding_window=sliding_window, **kwargs)

    attention.install(backbone, family_of("qwen_moe"))
    served_hidden_states(backbone, record)
    assert windows == [None if fused else WINDOW] * 2


def test_phi3_su_rotary_per_token_equals_keras_hub_decoding():
    backbone = tiny_backbone("phi3_su")
    rotary = attention._attention_layer(
        backbone.transformer_layers[0]
    ).rotary_embedding_layer
    pretraining = rotary.pretraining_sequence_length
    positions = np.array([0, 5, pretraining - 1, pretraining, 3 * pretraining])
    inputs = np.random.default_rng(0).normal(size=(len(positions), 1, 4, 32))
    inputs = keras.ops.convert_to_tensor(inputs, "float32")
    routed = phi3.phi3_su_rotary(
        rotary, inputs, keras.ops.convert_to_tensor(positions[:, None])
    )
    for row, position in enumerate(positions):
        # What generate() computes for a token decoded at `position`.
        expected = rotary(inputs[row : row + 1], start_index=int(position))
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(routed[row : row + 1]),
            keras.ops.convert_to_numpy(expected),
            atol=1e-5,
        )


def test_gpt_oss_hands_vllm_its_sinks_and_keras_hubs_window():
    # KerasHub's GPT-OSS windows the odd layers and keeps `sliding_window + 1`
    # keys (`k >= q - sliding_window`); HF's windows the even layers and keeps
    # `sliding_window`. Serving follows KerasHub; that this is what KerasHub
    # computes is `test_route_equals_the_layers_own_attention[gpt_oss]`.
    backbone = tiny_backbone("gpt_oss")
    layers = [attention._attention_layer(layer) for layer in backbone.transformer_layers]
    assert [layer.sliding_window for layer in layers] == [None, WINDOW]
    options = []

    def record(*args, **kwargs):
        options.append(kwargs)
        return reference_attention(*args, **kwargs)

    attention.install(backbone, family_of("gpt_oss"))
    served_hidden_states(backbone, record)
    assert [o["sliding_window"] for o in options] == [None, WINDOW + 1]
    for layer, o in zip(layers, options, strict=True):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(o["sinks"]),
            keras.ops.convert_to_numpy(layer.sinks),
        )


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_last_layers_share_the_kv_of_the_last_earlier_layer_of_their_type(family):
    # Tiny presets: sliding, full, sliding, full; the last 2 layers shared.
    backbone = tiny_backbone(family)
    attention.install(backbone, family_of(family))
    layers = [attention._attention_layer(layer) for layer in transformer_layers(backbone)]
    assert [layer._vllm_kv_sharing_target for layer in layers] == [None, None, 0, 1]
    options = []

    def record(cache, query, key, value, *args, **kwargs):
        options.append(dict(kwargs, key=key))
        return reference_attention(cache, query, key, value, *args, **kwargs)

    served_hidden_states(backbone, record)
    assert [o["kv_sharing_target"] for o in options] == [None, None, 0, 1]
    assert [o["sliding_window"] for o in options] == [WINDOW, None] * 2
    # Shared layers hand over no K/V of their own (placeholders only).
    for o in options[2:]:
        assert not torch.as_tensor(o["key"]).any()


def test_gemma4_hands_vllm_per_layer_head_sizes_and_its_soft_cap():
    # Global layers: `global_head_dim` 128 and one K=V head; local: 32 and 2.
    backbone = tiny_backbone("gemma4")
    attention.install(backbone, family_of("gemma4"))
    options = []

    def record(*args, **kwargs):
        _, _, _, _, scale, head_size, _, num_kv_heads = args
        options.append((head_size, num_kv_heads, scale, kwargs["soft_cap"]))
        return reference_attention(*args, **kwargs)

    served_hidden_states(backbone, record)
    assert options == [(32, 2, 1.0, 50.0), (128, 1, 1.0, 50.0)] * 2


def test_gemma4_drafter_backbone_is_refused():
    # A drafter (`*_assistant` preset) shares every layer's K/V with the
    # target model's cache: nothing in its own model to point vLLM at.
    _, backbone_name, _ = TINY_FAMILIES["gemma4"]
    kwargs = {**backbone_kwargs("gemma4", 64), "num_kv_shared_layers": 4}
    backbone = getattr(keras_hub.models, backbone_name)(**kwargs)
    with pytest.raises(ValueError, match="drafter"):
        attention.install(backbone, family_of("gemma4"))


def test_gemma4_bidirectional_embedding_model_is_refused():
    backbone = tiny_backbone("gemma4")
    attention.install(backbone, family_of("gemma4"))
    for block in backbone.transformer_layers:
        block.attention.use_bidirectional_attention = True
    with pytest.raises(ValueError, match="bidirectional attention"):
        served_hidden_states(backbone, reference_attention, np.arange(1, 5))

"""Pipeline stages: each holds its own layers, and together they are the model.

Each stage is loaded as its rank loads it, in a backbone of its own with
only its weights read from the preset, and the stages run one after the
other on the hidden states they pass, as vLLM passes them between ranks.
They run without an engine, on one multi-token sequence with KerasHub's own
causal attention, so every token's hidden state depends on the tokens
before it: queries, keys, positions, windows and norms all count.
`parallel_test.py` serves stages with vLLM's attention.
"""

import keras_hub
import pytest
import torch

from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.loading.preset_weights import PresetWeights
from vllm_keras_hub.loading.preset_weights import unloaded_backbone
from vllm_keras_hub.lora import merged as lora
from vllm_keras_hub.models import pipeline
from vllm_keras_hub.models.text_forward import text_forward
from vllm_keras_hub.parallel_settings import PIPELINE_REFUSALS
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.lora import fine_tune_lora
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.presets import TINY_FAMILIES

# One sequence longer than the tiny presets' 8-token windows.
TOKENS = torch.tensor([[5, 9, 2, 7, 11, 3, 8, 4, 12, 6, 10, 13]])
POSITIONS = torch.arange(TOKENS.shape[1])[None]
# (family, multimodal): every family that can be cut, and Gemma3's vision
# presets, whose text path is a loop over the layers, not its graph. The
# tiny Gemma4s' 4 layers all read or are read by KV-sharing layers, so they
# are one stage's, and the tiny Qwen3.5s' first 2 hold no attention layer:
# `test_gemma4_stages_...` and `test_hybrid_stages_...` cut more layers.
UNCUT_TINY = ("Gemma4Backbone", "Qwen3_5Backbone", "Qwen3_5MoeBackbone")
CUT = [
    (family, False)
    for family, (_, backbone, _) in sorted(TINY_FAMILIES.items())
    if backbone not in PIPELINE_REFUSALS and backbone not in UNCUT_TINY
] + [("gemma3", True)]


@pytest.fixture(scope="module")
def presets(shared):
    return lambda family, multimodal=False: shared.preset(family, multimodal=multimodal)


def _whole_forward(preset, tokens=TOKENS, positions=POSITIONS):
    backbone = keras_hub.models.Backbone.from_preset(preset, dtype="float32")
    with torch.inference_mode():
        hidden = text_forward(backbone, tokens, torch.ones_like(tokens), positions)
    return hidden, sum(v.value.numel() for v in backbone.variables)


def _loaded_stage(preset, rank, size, lora_weights=None):
    """Stage `rank` of `size`, loaded as its rank loads it (`models/causal.py`)."""
    backbone = unloaded_backbone(preset, "float32")
    weights = PresetWeights(backbone, preset)
    stage = pipeline.stage(backbone, rank, size)
    unused = stage.unused_variables()
    weights.release(unused)
    if lora_weights is not None:
        lora.load_adapter(backbone, lora_weights, weights)
        lora.merge_lora(backbone)
    weights.finish()
    return stage, unused


def _run_stages(preset, size, lora_weights=None):
    hidden, stages = None, []
    for rank in range(size):
        stage, unused = _loaded_stage(preset, rank, size, lora_weights)
        with torch.inference_mode():
            hidden = stage.forward(TOKENS, torch.ones_like(TOKENS), POSITIONS, hidden)
        stages.append((stage, unused))
    return hidden, stages


@pytest.mark.parametrize("family, multimodal", CUT)
def test_two_stages_are_the_whole_model(presets, family, multimodal):
    preset = presets(family, multimodal)
    expected, whole = _whole_forward(preset)
    # The tokens attend to each other: alone, each gives another state.
    alone, _ = _whole_forward(preset, TOKENS.reshape(-1, 1), POSITIONS.reshape(-1, 1))
    assert not torch.allclose(alone[1:, 0], expected[0, 1:], atol=1e-3)
    hidden, stages = _run_stages(preset, 2)
    torch.testing.assert_close(hidden, expected, rtol=0, atol=0)

    layers = len(transformer_layers(stages[0][0].backbone))
    assert [(s.start, s.end) for s, _ in stages] == [(0, layers // 2), (layers // 2, layers)]
    held = []
    for stage, unused in stages:
        backbone = stage.backbone
        others = [
            layer
            for index, layer in enumerate(transformer_layers(backbone))
            if not stage.start <= index < stage.end
        ]
        # Another stage's layers were never read; this stage's were.
        for layer in others:
            assert all(v.value.numel() == 0 for v in layer.variables), layer.name
        for layer in stage.layers:
            assert all(v.value.numel() > 0 for v in layer.variables), layer.name
        held.append(sum(v.value.numel() for v in backbone.variables))
        assert len(unused) > 0
    embedding = token_embedding(stages[0][0].backbone)
    # Both stages hold a tied embedding (input, output head), as vLLM's own
    # models do; each holds about half of the rest.
    table = embedding.embeddings.value.numel()
    tied = getattr(embedding, "tie_weights", True)
    shared = table if tied else 0
    assert sum(held) - shared <= whole * 1.01
    for count in held:
        assert count - shared < 0.75 * (whole - shared)


def test_three_stages_keep_the_embedding_and_head_at_the_ends(presets):
    # SmolLM3's 4 layers cut as vLLM cuts them: [1, 2, 1].
    preset = presets("smollm3")
    expected, _ = _whole_forward(preset)
    hidden, stages = _run_stages(preset, 3)
    torch.testing.assert_close(hidden, expected, rtol=0, atol=0)
    assert [(s.start, s.end) for s, _ in stages] == [(0, 1), (1, 3), (3, 4)]
    first, middle, last = (stage.backbone for stage, _ in stages)
    assert token_embedding(middle).embeddings.value.numel() == 0
    assert token_embedding(first).embeddings.value.numel() > 0
    # The final norm, the layer the backbone's output comes from.
    for backbone, held in ((first, False), (middle, False), (last, True)):
        norm = backbone.output._keras_history.operation
        assert all((v.value.numel() > 0) == held for v in norm.variables)


def test_untied_head_is_held_by_the_last_stage_only(presets):
    first, _ = _loaded_stage(presets("llama3"), 0, 2)
    last, _ = _loaded_stage(presets("llama3"), 1, 2)
    assert not token_embedding(first.backbone).tie_weights
    first_embedding = token_embedding(first.backbone)
    last_embedding = token_embedding(last.backbone)
    assert first_embedding.embeddings.value.numel() > 0
    assert first_embedding.reverse_embeddings.value.numel() == 0
    assert last_embedding.embeddings.value.numel() == 0
    assert last_embedding.reverse_embeddings.value.numel() > 0


@pytest.mark.parametrize("family", ["gemma3n"])
def test_families_that_cannot_be_cut_are_refused(presets, family):
    backbone = unloaded_backbone(presets(family), "float32")
    with pytest.raises(UnsupportedParallelismError, match="cannot be served with pipeline"):
        pipeline.stage(backbone, 0, 2)
    support_matrix.record_refusal(type(backbone).__name__, "pp2")


def test_a_stage_with_no_layers_is_refused(presets, monkeypatch):
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "2,0")
    backbone = unloaded_backbone(presets("llama3"), "float32")
    assert pipeline.stage(backbone, 0, 2).last is False
    with pytest.raises(UnsupportedParallelismError, match="would hold none"):
        pipeline.stage(backbone, 1, 2)


def test_a_lora_adapter_merges_into_each_stages_own_layers(presets, tmp_path):
    """`--lora-weights` under pipeline parallelism: each stage merges the
    adapter's layers it holds, and together they are the fine-tuned model."""
    adapter, tuned_preset = fine_tune_lora(presets("llama3"), str(tmp_path))
    expected, _ = _whole_forward(tuned_preset)
    hidden, _ = _run_stages(presets("llama3"), 2, lora_weights=adapter)
    # Keras merged the saved kernels with the same `kernel + A @ B`.
    torch.testing.assert_close(hidden, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gemma4", "gemma4_moe"])
def test_gemma4_stages_keep_kv_sharing_layers_with_their_sources(
    family, presets, tmp_path, monkeypatch
):
    """6 layers, the last 2 KV-sharing (layer 4 reads layer 2's cache, 5
    reads 3's): vLLM would cut at layer 3, between 4 and 2, so the cut
    moves down to 2. The first stage makes the per-layer inputs of all
    layers, and they cross beside the hidden states."""
    preset = build_tiny_preset(
        family, str(tmp_path / "six"), backbone_overrides={"num_layers": 6}
    )
    layers = transformer_layers(unloaded_backbone(preset, "float32"))
    assert [(i, layer.kv_shared_layer_index) for i, layer in enumerate(layers)
            if layer.is_kv_shared_layer] == [(4, 2), (5, 3)]  # fmt: skip
    expected, _ = _whole_forward(preset)
    hidden, stages = _run_stages(preset, 2)
    torch.testing.assert_close(hidden, expected, rtol=0, atol=0)
    assert [(s.start, s.end) for s, _ in stages] == [(0, 2), (2, 6)]
    first, last = (stage.backbone for stage, _ in stages)
    # The per-layer tables are the first stage's alone.
    for name in ("per_layer_token_embedding", "per_layer_model_projection"):
        assert all(v.value.numel() > 0 for v in getattr(first, name).variables)
        assert all(v.value.numel() == 0 for v in getattr(last, name).variables)
    per_layer = first.hidden_size_per_layer_input
    assert stages[1][0].hidden_size == first.hidden_dim + 6 * per_layer > first.hidden_dim

    # A cut between a KV-sharing layer and its source is refused, as asked
    # for or as the only one left (all 4 tiny layers are one group).
    backbone = unloaded_backbone(preset, "float32")
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "3,3")
    with pytest.raises(UnsupportedParallelismError, match="between layer 4, .* layer 2"):
        pipeline.stage(backbone, 0, 2)
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION")
    four = unloaded_backbone(presets(family), "float32")
    with pytest.raises(UnsupportedParallelismError, match="layers 0 to 3\\) must be in one"):
        pipeline.stage(four, 1, 2)


@pytest.mark.parametrize(
    "family, multimodal", [("qwen3_5", False), ("qwen3_5", True), ("qwen3_5_moe", False)]
)
def test_hybrid_stages_each_hold_an_attention_layer(family, multimodal, presets, tmp_path):
    """8 hybrid layers (attention at 3 and 7) cut as vLLM cuts them, each
    stage with its Gated DeltaNet layers and one attention layer; the tiny
    4-layer preset's first stage would hold Gated DeltaNet layers only,
    which vLLM 0.32's engine cannot start, so it is refused. A preset with
    a vision encoder (every published Qwen3.5 one) runs its text path as a
    loop over the layers, and only the first stage reads the encoder."""
    preset = build_tiny_preset(
        family,
        str(tmp_path / "eight"),
        multimodal=multimodal,
        backbone_overrides={"num_layers": 8},
    )
    expected, _ = _whole_forward(preset)
    hidden, stages = _run_stages(preset, 2)
    torch.testing.assert_close(hidden, expected, rtol=0, atol=0)
    assert [(s.start, s.end) for s, _ in stages] == [(0, 4), (4, 8)]
    encoders = [getattr(s.backbone, "vision_encoder", None) for s, _ in stages]
    if multimodal:
        held = [sum(v.value.numel() for v in e.variables) for e in encoders]
        assert held[0] > 0 and held[1] == 0
    else:
        assert encoders == [None, None]
    four = unloaded_backbone(presets(family, multimodal), "float32")
    with pytest.raises(UnsupportedParallelismError, match="Gated DeltaNet layers only"):
        pipeline.stage(four, 1, 2)

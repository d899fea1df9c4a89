import pytest

from vllm_keras_hub.models import families


def test_routed_families_are_keras_hub_routes_and_ours():
    assert families.supported_families() == [
        "GPT-2",
        "OPT",
        "Llama",
        "Llama3",
        "Mistral",
        "Qwen 2/2.5",
        "Qwen3",
        "Gemma / Gemma2",
        "Gemma3 (text)",
        "Mixtral",
        "Qwen1.5-MoE",
        "Qwen3-MoE",
        "SmolLM3",
        "Phi-3",
        "GPT-NeoX",
        "Bloom",
        "Falcon",
        "GPT-OSS",
        "Gemma3n",
        "Gemma4",
        "Qwen3.5",
        "Qwen3.5-MoE",
        "PaliGemma",
    ]


def test_every_keras_hub_causal_lm_family_is_in_the_table():
    import keras_hub

    backbones = {
        getattr(keras_hub.models, name).backbone_cls.__name__
        for name in dir(keras_hub.models)
        if name.endswith("CausalLM") and name != "CausalLM"
    }
    # Multimodal-only tasks (BLIP-2, PaliGemma, PARSeq) are not text families.
    backbones -= {"BLIP2Backbone", "PaliGemmaBackbone", "PARSeqBackbone"}
    known = {family.backbone for family in families.FAMILIES}
    assert backbones <= known, backbones - known


def test_unknown_backbone_is_refused_with_the_supported_list():
    with pytest.raises(families.UnsupportedFamilyError, match="GPT-2, OPT"):
        families.family_for_backbone("T5Backbone", "t5_tiny")


def test_encoder_families_are_not_listed_as_causal_lms():
    supported = families.supported_families()
    assert "BERT" not in supported and "XLM-RoBERTa" not in supported
    assert families.family_for_backbone("BertBackbone").embedder_only


def test_family_without_route_says_why():
    with pytest.raises(families.UnsupportedFamilyError, match="recurrent state"):
        families.family_for_backbone("RWKV7Backbone")


@pytest.mark.parametrize(
    "backbone, stop_tokens",
    [("Gemma3nBackbone", ("<end_of_turn>",)), ("Gemma4Backbone", ("<turn|>",))],
)
def test_kv_sharing_families_are_routed_with_their_turn_end(backbone, stop_tokens):
    # Each `generate()` also stops on its turn end: Gemma3n's `<end_of_turn>`,
    # Gemma4's `<turn|>`.
    family = families.family_for_backbone(backbone)
    assert family.route == "vllm_keras_hub"
    assert family.stop_tokens == stop_tokens

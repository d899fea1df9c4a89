import pytest

from vllm_keras_hub import families


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


def _classes_of(family):
    # Every class the modules of the family's keras-hub package define.
    import importlib
    import pkgutil

    import keras_hub

    backbone = getattr(keras_hub.models, family.backbone)
    package = importlib.import_module(backbone.__module__.rsplit(".", 1)[0])
    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith(("_test", "_presets")) or "convert" in info.name:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        names |= {name for name, value in vars(module).items() if isinstance(value, type)}
    return names


def test_each_route_names_a_class_of_its_own_family():
    # A route keyed by a class name that keras-hub renamed, or that belongs to
    # another family, would never be installed: the probe would refuse the
    # preset at start-up. Keras's `MultiHeadAttention` is the encoders' own.
    missing = {}
    for family in families.FAMILIES:
        routed = {*family.attention, *family.moe, *family.state_layers}
        if routed:
            missing[family.name] = routed - _classes_of(family) - {"MultiHeadAttention"}
    assert len(missing) == 22
    assert not any(missing.values()), missing


@pytest.mark.parametrize(
    "change, problem",
    [
        (dict(attention={}), "names no attention route"),
        (dict(route="keras_hub"), "does not use"),
        (dict(route=None), "no reason why"),
        (dict(state_layers=()), "name state layers"),
        (dict(route="jax"), "none of"),
        (dict(embedder_only=True), "served on one rank"),
    ],
)
def test_the_table_refuses_an_incomplete_row(change, problem):
    import dataclasses

    row = dataclasses.replace(families.family_by_name("qwen3_5"), **change)
    with pytest.raises(ValueError, match=problem):
        families._check(row)


def test_two_families_may_share_a_route_only_if_it_is_the_same():
    assert families.ATTENTION_ROUTES["MultiHeadAttention"] is (
        families.family_by_name("bert").attention["MultiHeadAttention"]
    )
    assert families.MOE_ROUTES["Gemma4MoEBlock"] is (
        families.family_by_name("gemma4").moe["Gemma4MoEBlock"]
    )


def test_each_family_served_with_images_has_its_parts_in_its_folder():
    """A family's image model class and its media formats are in its own
    folder, where the shared machinery finds them (`families.part`); so is
    each drafter's class. The table cannot import them itself: they import
    the model machinery, which imports the table."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_keras_hub.export.architectures import CLASSES

    with_images = [family for family in families.FAMILIES if family.image_architecture]
    assert {family.name for family in with_images} >= {"gemma3", "gemma4", "qwen3_5"}
    for family in with_images:
        folder = f"vllm_keras_hub.families.{family.parts or family.name}"
        module, name = CLASSES[family.image_architecture].split(":")
        assert module == f"{folder}.media", family.name
        assert families.part(family, "media") is resolve_obj_by_qualname(module)
        assert hasattr(getattr(families.part(family, "media"), name), "embed_multimodal")
        assert hasattr(families.part(family, "formats"), "image_fields"), family.name
    assert families.part(families.family_by_name("llama3"), "media") is None
    assert families.DRAFTERS
    for task, drafter in families.DRAFTERS.items():
        cls = resolve_obj_by_qualname(drafter.model_class.replace(":", "."))
        assert cls.__module__.startswith("vllm_keras_hub.families."), task

"""One function picks a preset's model class; every class we register exists."""

import importlib

from vllm_keras_hub import families
from vllm_keras_hub.export import architectures


def test_every_registered_name_is_a_model_class():
    for name, path in architectures.CLASSES.items():
        module, _, class_name = path.partition(":")
        assert isinstance(getattr(importlib.import_module(module), class_name), type), name
    assert set(architectures.FORMER.values()) <= set(architectures.CLASSES)
    # Ours are our own: none is a name keras-hub's plugin or a former folder uses.
    assert not set(architectures.CLASSES) & set(architectures.FORMER)


def test_the_choice_by_what_a_preset_serves():
    choose = architectures.choose
    gemma4, qwen3_5 = families.family_by_name("gemma4"), families.family_by_name("qwen3_5")
    assert choose(families.family_by_name("llama3")) == "KerasHubTorchForCausalLM"
    assert choose(gemma4) == architectures.CAUSAL
    assert choose(gemma4, images=True) == architectures.GEMMA4_VISION
    assert choose(qwen3_5, hybrid=True) == architectures.HYBRID
    # Qwen3.5 with images is hybrid too: its image class serves both.
    assert choose(qwen3_5, images=True, hybrid=True) == architectures.MROPE
    with_images = {f.name for f in families.FAMILIES if f.image_architecture}
    assert with_images == {"gemma3", "gemma3n", "gemma4", "pali_gemma", "qwen3_5", "qwen3_5_moe"}

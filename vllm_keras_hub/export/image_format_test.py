"""A vision preset's image format, read from the preset as KerasHub reads it."""

import types

import keras_hub
import pytest

from vllm_keras_hub.export.image_format import image_fields
from vllm_keras_hub.export.image_format import needs_whole_images
from vllm_keras_hub.export.image_format import read_image_format
from vllm_keras_hub.export.preset_folder import read_preset
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset


def _fields(preset):
    family, backbone_config, _ = read_preset(preset)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    return image_fields(preset, family.backbone, backbone_config, tokenizer)


@pytest.mark.parametrize(
    "family, options, expected",
    [
        (
            "gemma3",
            {},
            dict(placeholder="<start_of_image>", image_token="<img>", newlines="\n\n",
                 tokens_per_image=16, bidirectional="all"),
        ),
        (
            "gemma3n",
            {},
            dict(placeholder="<start_of_image>", image_token="<image_soft_token>",
                 newlines="\n\n", tokens_per_image=16, bidirectional=None),
        ),
        (
            "gemma4",
            {},
            dict(placeholder="<|image|>", start_token="<|image>", image_token="<|image|>",
                 end_token="<image|>", newlines="", tokens_per_image=280, bidirectional=None),
        ),
        (
            "gemma4",
            dict(bidirectional=True),
            dict(tokens_per_image=280, bidirectional="sliding", window=384),
        ),
    ],
    ids=["gemma3", "gemma3n", "gemma4", "gemma4-bidirectional"],
)
def test_each_family_s_image_format(family, options, expected, tmp_path):
    fields = _fields(build_tiny_vision_preset(str(tmp_path), family, **options))
    image = fields["keras_hub_image"]
    assert {key: image[key] for key in expected} == expected
    assert needs_whole_images(image) == (expected["bidirectional"] is not None)


def test_a_preset_without_image_converter_or_image_tokens_serves_text(tmp_path):
    # model_test's multimodal presets: Gemma3's has no converter, Gemma4's
    # tokenizer no image tokens.
    for family in ("gemma3", "gemma4"):
        preset = build_tiny_preset(family, str(tmp_path / family), multimodal=True)
        assert _fields(preset) == {}


def test_a_folder_exported_before_the_format_grew_is_refused():
    config = types.SimpleNamespace(
        keras_hub_image=dict(placeholder="<start_of_image>", image_token="<img>")
    )
    with pytest.raises(ValueError, match="Export it again"):
        read_image_format(config)

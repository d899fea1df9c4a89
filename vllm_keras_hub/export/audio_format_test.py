"""A Gemma3n preset's audio format, read from the preset as KerasHub reads it."""

import types

import keras_hub
import pytest

from vllm_keras_hub.export.audio_format import audio_fields
from vllm_keras_hub.export.audio_format import read_audio_format
from vllm_keras_hub.export.preset_folder import read_preset
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset


def _fields(preset, serves_images=True):
    family, backbone_config, _ = read_preset(preset)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    return audio_fields(preset, family.backbone, backbone_config, tokenizer, serves_images)


def test_a_gemma3n_preset_with_audio(tmp_path):
    preset = build_tiny_vision_preset(str(tmp_path), "gemma3n", audio=True)
    audio = _fields(preset)["keras_hub_audio"]
    assert audio == dict(
        placeholder="<start_of_audio>",
        start_token="<start_of_audio>",
        audio_token="<audio_soft_token>",
        end_token="<end_of_audio>",
        newlines="\n\n",
        tokens_per_clip=16,
        sampling_rate=16000,
        max_samples=480000,
    )
    assert read_audio_format(types.SimpleNamespace(keras_hub_audio=audio)) == audio


def test_without_an_audio_encoder_or_images_no_audio(tmp_path):
    without_encoder = build_tiny_vision_preset(str(tmp_path / "vision"), "gemma3n")
    assert _fields(without_encoder) == {}
    with_audio = build_tiny_vision_preset(str(tmp_path / "audio"), "gemma3n", audio=True)
    # Its model class, Gemma3n's with images, is the one that takes audio.
    assert _fields(with_audio, serves_images=False) == {}


def test_a_folder_exported_before_the_format_grew_is_refused():
    config = types.SimpleNamespace(keras_hub_audio=dict(placeholder="<start_of_audio>"))
    with pytest.raises(ValueError, match="Export it again"):
        read_audio_format(config)
    assert read_audio_format(types.SimpleNamespace()) is None

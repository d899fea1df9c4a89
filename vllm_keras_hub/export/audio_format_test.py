"""A Gemma3n preset's audio format, read from the preset as KerasHub reads it."""

import json
import os
import types

import keras
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


def test_a_published_layout_with_its_preprocessor_config(tmp_path):
    """Published presets also carry `preprocessor.json` (its class needs
    TensorFlow to build, so it is written here as KerasHub writes it); the
    folder reads the same formats from the preset's own parts."""
    from vllm_keras_hub.export.preset_folder import write_model_folder
    from vllm_keras_hub.models.audio import _audio_converter

    preset = build_tiny_vision_preset(str(tmp_path / "preset"), "gemma3n", audio=True)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    config = dict(
        tokenizer=keras.saving.serialize_keras_object(tokenizer),
        audio_converter=keras.saving.serialize_keras_object(_audio_converter(preset)),
        sequence_length=1024,
        add_start_token=True,
        add_end_token=True,
        max_images_per_prompt=2,
        num_vision_tokens_per_image=16,
        max_audios_per_prompt=2,
        num_audio_tokens_per_audio=16,
    )
    with open(os.path.join(preset, "preprocessor.json"), "w") as f:
        json.dump(
            {
                "module": "keras_hub.src.models.gemma3n.gemma3n_causal_lm_preprocessor",
                "class_name": "Gemma3nCausalLMPreprocessor",
                "config": config,
                "registered_name": "keras_hub>Gemma3nCausalLMPreprocessor",
            },
            f,
        )
    folder = tmp_path / "folder"
    folder.mkdir()
    write_model_folder(preset, str(folder))
    with open(folder / "config.json") as f:
        written = json.load(f)
    assert written["keras_hub_audio"] == _fields(preset)["keras_hub_audio"]
    assert written["keras_hub_image"]["tokens_per_image"] == 16

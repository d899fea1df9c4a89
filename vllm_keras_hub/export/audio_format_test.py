"""A Gemma3n preset's audio format, read from the preset as KerasHub reads it."""

import json
import os
import types

import keras
import keras_hub
import pytest

from vllm_keras_hub.export.audio_format import audio_fields
from vllm_keras_hub.export.audio_format import clip_tokens
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
        frame_stride=None,
        sampling_rate=16000,
        max_samples=480000,
    )
    assert read_audio_format(types.SimpleNamespace(keras_hub_audio=audio)) == audio
    # Every clip is padded or cut to the same soft tokens.
    assert clip_tokens(audio, 100) == clip_tokens(audio, 10**6) == 16


def test_a_gemma4_preset_with_audio(tmp_path):
    preset = build_tiny_vision_preset(str(tmp_path), "gemma4", audio=True)
    audio = _fields(preset)["keras_hub_audio"]
    assert audio == dict(
        placeholder="<|audio|>",
        start_token="<|audio>",
        audio_token="<|audio|>",
        end_token="<audio|>",
        newlines="",
        tokens_per_clip=750,
        frame_stride=160,
        sampling_rate=16000,
        max_samples=480000,
    )
    # `Gemma4CausalLMPreprocessor`'s count: valid frames over 4, rounded up,
    # the frames cut at 30 s.
    counts = [clip_tokens(audio, n) for n in (160, 639, 640, 800, 16000, 480000, 10**6)]
    assert counts == [1, 1, 1, 2, 25, 750, 750]
    with pytest.raises(ValueError, match="159 samples is shorter than one frame"):
        clip_tokens(audio, 159)


def test_a_gemma4_tokenizer_without_audio_tokens_serves_no_audio(tmp_path):
    """A Gemma4 preset with an audio encoder and converter whose vocabulary
    lacks the audio pieces is served with images alone."""
    from vllm_keras_hub.testing.tokenizers import make_tokenizer

    preset = build_tiny_vision_preset(str(tmp_path), "gemma4", audio=True)
    make_tokenizer("gemma4", images=True).save_to_preset(preset)
    assert _fields(preset) == {}


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


# Each family's preprocessor config beside its tokenizer and converters,
# as the published presets carry it.
PREPROCESSORS = {
    "gemma3n": (
        "Gemma3nCausalLMPreprocessor",
        dict(
            max_images_per_prompt=2,
            num_vision_tokens_per_image=16,
            max_audios_per_prompt=2,
            num_audio_tokens_per_audio=16,
        ),
    ),
    "gemma4": (
        "Gemma4CausalLMPreprocessor",
        dict(
            max_images_per_prompt=2,
            num_vision_tokens_per_image=280,
            max_audio_clips_per_prompt=1,
            num_audio_tokens_per_clip=750,
            audio_input_feat_size=32,
        ),
    ),
}


@pytest.mark.parametrize("family", sorted(PREPROCESSORS))
def test_a_published_layout_with_its_preprocessor_config(tmp_path, family):
    """Published presets also carry `preprocessor.json` (its class needs
    TensorFlow to build, so it is written here as KerasHub writes it); the
    folder reads the same formats from the preset's own parts."""
    from vllm_keras_hub.export.preset_folder import write_model_folder
    from vllm_keras_hub.models.audio import audio_converter

    preset = build_tiny_vision_preset(str(tmp_path / "preset"), family, audio=True)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    class_name, options = PREPROCESSORS[family]
    config = dict(
        tokenizer=keras.saving.serialize_keras_object(tokenizer),
        audio_converter=keras.saving.serialize_keras_object(audio_converter(preset)),
        sequence_length=1024,
        add_start_token=True,
        add_end_token=True,
        **options,
    )
    module = f"keras_hub.src.models.{family}.{family}_causal_lm_preprocessor"
    with open(os.path.join(preset, "preprocessor.json"), "w") as f:
        json.dump(
            {
                "module": module,
                "class_name": class_name,
                "config": config,
                "registered_name": f"keras_hub>{class_name}",
            },
            f,
        )
    folder = tmp_path / "folder"
    folder.mkdir()
    write_model_folder(preset, str(folder))
    with open(folder / "config.json") as f:
        written = json.load(f)
    assert written["keras_hub_audio"] == _fields(preset)["keras_hub_audio"]
    assert written["keras_hub_image"]["tokens_per_image"] == options["num_vision_tokens_per_image"]

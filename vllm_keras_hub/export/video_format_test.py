"""A Gemma4 preset's video format, read from the preset as KerasHub reads it."""

import json
import os
import types

import keras
import keras_hub
import pytest

from vllm_keras_hub.export.preset_folder import read_preset
from vllm_keras_hub.families.gemma4.video import frame_tokens
from vllm_keras_hub.export.video_format import read_video_format
from vllm_keras_hub.export.video_format import video_fields
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset


def _fields(preset, serves_images=True):
    family, _, _ = read_preset(preset)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    return video_fields(preset, family.backbone, tokenizer, serves_images)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_vision_preset(
        str(tmp_path_factory.mktemp("gemma4_video")), "gemma4", video=True
    )


def test_a_gemma4_preset_with_a_video_converter(preset):
    video = _fields(preset)["keras_hub_video"]
    assert video == dict(
        placeholder="<|video|>",
        start_token="<|image>",
        video_token="<|video|>",
        end_token="<image|>",
        num_frames=4,
        max_soft_tokens=70,
        patch_size=8,
        pooling=3,
        fps=24.0,
        tokens_per_video=4 * (70 + 2 + 8),
        layout="gemma4",
    )
    assert read_video_format(types.SimpleNamespace(keras_hub_video=video)) == video
    # `Gemma4CausalLMPreprocessor`'s own count from a frame's size.
    assert [frame_tokens(video, *size) for size in ((48, 64), (64, 30), (8, 8))] == [63, 60, 64]


def test_the_converter_loads_where_keras_hubs_own_from_preset_fails(preset):
    """KerasHub 0.32's bug: `Gemma4VideoConverter` names no `backbone_cls`,
    so `from_preset` finds no converter for a Gemma4 preset."""
    from keras_hub.src.layers.preprocessing.video_converter import VideoConverter
    from keras_hub.src.models.gemma4.gemma4_video_converter import Gemma4VideoConverter

    from vllm_keras_hub.export.video_format import load_video_converter

    with pytest.raises(ValueError, match="Unable to find a subclass of VideoConverter"):
        VideoConverter.from_preset(preset)
    converter = load_video_converter(preset)
    assert isinstance(converter, Gemma4VideoConverter) and converter.num_frames == 4


def test_presets_served_without_video(tmp_path, preset):
    """No video converter, or no images served, or another family: no video."""
    assert _fields(preset, serves_images=False) == {}
    without = build_tiny_vision_preset(str(tmp_path / "images"), "gemma4")
    assert _fields(without) == {}
    gemma3n = build_tiny_vision_preset(str(tmp_path / "gemma3n"), "gemma3n")
    assert _fields(gemma3n) == {}


def test_a_published_layout_with_its_preprocessor_config(tmp_path, preset):
    """Published presets also carry `preprocessor.json` (its class needs
    TensorFlow to build, so it is written here as KerasHub writes it), with
    the video converter and the preprocessor's `video_fps`."""
    import shutil

    from vllm_keras_hub.export.video_format import load_video_converter

    published = str(tmp_path / "published")
    shutil.copytree(preset, published)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(published)
    config = dict(
        tokenizer=keras.saving.serialize_keras_object(tokenizer),
        video_converter=keras.saving.serialize_keras_object(load_video_converter(published)),
        sequence_length=1024,
        num_frames_per_video=4,
        video_fps=12.0,
    )
    with open(os.path.join(published, "preprocessor.json"), "w") as f:
        json.dump(
            {
                "module": "keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor",
                "class_name": "Gemma4CausalLMPreprocessor",
                "config": config,
                "registered_name": "keras_hub>Gemma4CausalLMPreprocessor",
            },
            f,
        )
    video = _fields(published)["keras_hub_video"]
    assert video["fps"] == 12.0 and video["num_frames"] == 4


def test_a_folder_exported_before_video_is_refused_with_the_fix(preset):
    video = _fields(preset)["keras_hub_video"]
    del video["tokens_per_video"]
    with pytest.raises(ValueError, match="lacks \\['tokens_per_video'\\].*export"):
        read_video_format(types.SimpleNamespace(keras_hub_video=video))
    assert read_video_format(types.SimpleNamespace()) is None


def test_a_qwen3_5_preset_with_both_converters(tmp_path):
    """Its video format, and both converters as its preprocessor holds
    them: KerasHub 0.32 saved the video converter's plain inner
    `ImageConverter` over `image_converter.json`."""
    from vllm_keras_hub.export.image_format import load_image_converter
    from vllm_keras_hub.export.video_format import load_video_converter

    preset = build_tiny_vision_preset(str(tmp_path / "qwen3_5"), "qwen3_5", video=True)
    with open(os.path.join(preset, "image_converter.json")) as f:
        assert json.load(f)["class_name"] == "ImageConverter"
    image = load_image_converter(preset)
    assert type(image).__name__ == "Qwen3_5ImageConverter" and image.max_pixels == 96 * 96
    assert type(load_video_converter(preset)).__name__ == "Qwen3_5VideoConverter"
    assert _fields(preset)["keras_hub_video"] == dict(
        placeholder="<|video_pad|>",
        start_token="<|vision_start|>",
        video_token="<|video_pad|>",
        end_token="<|vision_end|>",
        num_frames=32,
        # Its 16,384 pixels in all, 2 frames of 16x16 a soft token.
        max_soft_tokens=32,
        patch_size=8,
        pooling=2,
        fps=2.0,
        tokens_per_video=32 + 16 * (2 + 16),
        layout="qwen3_5",
    )

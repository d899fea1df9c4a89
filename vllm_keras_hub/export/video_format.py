"""What a preset served with video needs: its format, in `config.json`.

A Gemma4 preset served with images (`image_format.py`) that also carries
a video converter (`video_converter.json`, as the published presets do) is
served with video too. Gemma4 has no video encoder: its preprocessor
samples frames with the converter, and its vision encoder takes each frame
as an image of at most `max_soft_tokens` (70) pooled patches. Its
`config.json` carries the video format as `keras_hub_video`, read by the
processor (`models/multimodal.py`, `models/video.py`) and the model class:
- `placeholder`: what a prompt writes for a video (`<|video|>`);
- `start_token`, `video_token`, `end_token`: each frame's span, as
  `Gemma4CausalLMPreprocessor._build_video_replacement` writes it:
  `mm:ss <|image>` + `<|video|>` per soft token + `<image|>`, the frames
  joined by a space, the timestamps from each frame's source index and the
  video's frame rate (`replacement`, KerasHub's own writer);
- `num_frames`, `max_soft_tokens`, `patch_size`, `pooling`: the
  converter's frames per video and their soft tokens' bound and shape;
- `fps`: the preprocessor's `video_fps`, for a video whose metadata gives
  no frame rate;
- `tokens_per_video`: the most tokens a video's span can take, for vLLM's
  budgets.
"""

# A timestamp's tokens, at most: " mm:ss " is 7 characters, one token each
# at worst, and one more where the tokenizer marks a word's start apart.
TIMESTAMP_TOKENS = 8

# `Gemma4CausalLMPreprocessor`'s `video_fps` default.
DEFAULT_FPS = 24.0

FIELDS = (
    "placeholder", "start_token", "video_token", "end_token", "num_frames",
    "max_soft_tokens", "patch_size", "pooling", "fps", "tokens_per_video",
)  # fmt: skip


def load_video_converter(preset):
    """The preset's video converter, or `None` if it has none.

    Read through the preset loader: `VideoConverter.from_preset` fails on
    every Gemma4 preset in KerasHub 0.32 (`Gemma4VideoConverter` names no
    `backbone_cls`, so `find_subclass` finds no converter for the backbone).
    """
    from keras_hub.src.layers.preprocessing.video_converter import VideoConverter
    from keras_hub.src.utils.preset_utils import check_file_exists
    from keras_hub.src.utils.preset_utils import get_preset_loader

    if not check_file_exists(preset, "video_converter.json"):
        return None
    return get_preset_loader(preset).load_video_converter(VideoConverter)


def _preprocessor_fps(preset):
    from keras_hub.src.utils.preset_utils import check_file_exists
    from keras_hub.src.utils.preset_utils import load_json

    if not check_file_exists(preset, "preprocessor.json"):
        return DEFAULT_FPS
    config = load_json(preset, "preprocessor.json").get("config", {})
    return float(config.get("video_fps", DEFAULT_FPS))


def video_fields(preset, backbone_class, tokenizer, serves_images):
    """The `config.json` fields of a preset served with video; `{}` if none.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (video
            frames go through the same vision encoder).
    """
    if not serves_images or backbone_class != "Gemma4Backbone":
        return {}
    if getattr(tokenizer, "video_placeholder_id", None) in (None, -1):
        return {}
    converter = load_video_converter(preset)
    if converter is None:
        return {}
    num_frames = int(converter.num_frames)
    max_soft_tokens = int(converter.max_soft_tokens)
    video = dict(
        placeholder=tokenizer.video_placeholder,
        start_token=tokenizer.start_of_image_token,
        video_token=tokenizer.video_placeholder,
        end_token=tokenizer.end_of_image_token,
        num_frames=num_frames,
        max_soft_tokens=max_soft_tokens,
        patch_size=int(converter.patch_size),
        pooling=int(converter.pooling_kernel_size),
        fps=_preprocessor_fps(preset),
        tokens_per_video=num_frames * (max_soft_tokens + 2 + TIMESTAMP_TOKENS),
    )
    return dict(keras_hub_video=video)


def read_video_format(config):
    """The `keras_hub_video` of a model folder's config, or `None`.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    from vllm_keras_hub.export.hf_config import read_media_format

    return read_media_format(config, "video", FIELDS)


def frame_tokens(video, height, width):
    """A frame's soft tokens, as `Gemma4CausalLMPreprocessor` counts them
    from the frame's size (its own `_get_num_vision_tokens`)."""
    from keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor import (
        _get_num_vision_tokens,
    )

    return _get_num_vision_tokens(
        height, width, video["patch_size"], video["max_soft_tokens"], video["pooling"]
    )


def replacement(count, frames_indices, fps):
    """A video's span as text, written by `Gemma4CausalLMPreprocessor`'s
    own `_build_video_replacement` (it reads nothing of its preprocessor).

    Args:
        count: Each frame's soft tokens.
        frames_indices: The kept frames' indices in the source.
        fps: The source's frame rate.
    """
    from keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor import (
        Gemma4CausalLMPreprocessor,
    )

    return Gemma4CausalLMPreprocessor._build_video_replacement(
        None, count, frames_indices, fps
    )

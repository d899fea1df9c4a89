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
  budgets;
- `layout`: `"gemma4"`, or `"qwen3_5"`: a Qwen3.5 preset's video converter
  cuts all the frames it is given into patches of 2 frames, merged 2x2
  into soft tokens within its pixel budget over all frames, and each pair
  of frames is `<t seconds><|vision_start|>` + `<|video_pad|>` per soft
  token + `<|vision_end|>` (`models/patches.py`); its `max_soft_tokens` is
  then the most a video's frames take in all, `patch_size` a patch's
  side and `pooling` the merge.
"""

# A timestamp's tokens, at most: " mm:ss " is 7 characters, one token each
# at worst, and one more where the tokenizer marks a word's start apart.
TIMESTAMP_TOKENS = 8

# `Gemma4CausalLMPreprocessor`'s `video_fps` default.
DEFAULT_FPS = 24.0

FIELDS = (
    "placeholder", "start_token", "video_token", "end_token", "num_frames",
    "max_soft_tokens", "patch_size", "pooling", "fps", "tokens_per_video", "layout",
)  # fmt: skip

# vLLM's video loader's frames per video by default, which a Qwen3.5
# converter (it samples none itself) takes all of.
QWEN3_5_FRAMES = 32
# A Qwen3.5 timestamp's tokens, at most: `<123.4 seconds>`, one a character.
QWEN3_5_TIMESTAMP_TOKENS = 16


def load_video_converter(preset):
    """The preset's video converter, or `None` if it has none.

    Read through the preset loader: `VideoConverter.from_preset` fails on
    every Gemma4 preset in KerasHub 0.32 (`Gemma4VideoConverter` names no
    `backbone_cls`, so `find_subclass` finds no converter for the backbone).
    """
    from keras_hub.src.layers.preprocessing.video_converter import VideoConverter

    from vllm_keras_hub.preset import Preset

    from vllm_keras_hub.export.image_format import preprocessor_part

    preset = Preset.of(preset)
    # As the preprocessor holds it, where it does (`load_image_converter`).
    converter = preprocessor_part(preset, "video_converter")
    if converter is not None:
        return converter
    if not preset.has("video_converter.json"):
        return None
    return preset.load(VideoConverter, exact=True)


def _preprocessor_fps(preset, default=DEFAULT_FPS):
    from vllm_keras_hub.preset import Preset

    return float(Preset.of(preset).preprocessor_config.get("video_fps", default))


def video_fields(preset, backbone_class, tokenizer, serves_images):
    """The `config.json` fields of a preset served with video; `{}` if none.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (video
            frames go through the same vision encoder).
    """
    if serves_images and backbone_class in ("Qwen3_5Backbone", "Qwen3_5MoeBackbone"):
        return _qwen3_5_fields(preset, tokenizer)
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
        layout="gemma4",
    )
    return dict(keras_hub_video=video)


def _qwen3_5_fields(preset, tokenizer):
    """A Qwen3.5 preset's video format: `QWEN3_5_FRAMES` frames a video.

    Its converter keeps the frames' pixels in all within `max_pixels`
    (each side a whole number of merge windows), two frames a patch.
    """
    converter = load_video_converter(preset)
    if converter is None or getattr(tokenizer, "video_token_id", None) is None:
        return {}
    stride = converter.patch_size * converter.spatial_merge_size
    temporal = converter.temporal_patch_size
    patches = -(-QWEN3_5_FRAMES // temporal)
    max_soft_tokens = converter.max_pixels // (temporal * stride**2)
    video = dict(
        placeholder=tokenizer.video_token,
        start_token=tokenizer.vision_start_token,
        video_token=tokenizer.video_token,
        end_token=tokenizer.vision_end_token,
        num_frames=QWEN3_5_FRAMES,
        max_soft_tokens=int(max_soft_tokens),
        patch_size=int(converter.patch_size),
        pooling=int(converter.spatial_merge_size),
        # `Qwen3_5CausalLMPreprocessor`'s default.
        fps=_preprocessor_fps(preset, default=2.0),
        tokens_per_video=int(max_soft_tokens + patches * (2 + QWEN3_5_TIMESTAMP_TOKENS)),
        layout="qwen3_5",
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

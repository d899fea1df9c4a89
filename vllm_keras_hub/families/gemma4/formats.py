"""The image, audio and video formats of a Gemma4 preset's model folder.

Each returns its `config.json` field (`export/image_format.py`,
`audio_format.py`, `video_format.py` say what the fields mean), or `{}`
where the preset does not take that modality.
"""

from vllm_keras_hub.export.image_format import gemma_image
from vllm_keras_hub.export.video_format import load_video_converter
from vllm_keras_hub.export.video_format import preprocessor_fps

# A timestamp's tokens, at most: " mm:ss " is 7 characters, one token each
# at worst, and one more where the tokenizer marks a word's start apart.
TIMESTAMP_TOKENS = 8

# `Gemma4CausalLMPreprocessor`'s `video_fps` default.
DEFAULT_FPS = 24.0


def image_fields(preset, backbone_config, tokenizer):
    # Every image's pooled patches, padded by its aspect ratio to the
    # converter's `max_soft_tokens` (KerasHub's preprocessor expands
    # `<|image|>` to `num_vision_tokens_per_image`, by default the same
    # 280), with no newlines. With `use_vision_bidirectional_attention`, its
    # sliding-window layers attend bidirectionally within each image.
    image, converter = gemma_image(preset, backbone_config, tokenizer)
    if image is None:
        return {}
    image.update(
        placeholder=tokenizer.image_placeholder,
        newlines="",
        tokens_per_image=int(converter.max_soft_tokens),
        image_size=int(backbone_config.get("image_size") or 896),
    )
    if backbone_config.get("use_vision_bidirectional_attention"):
        image.update(bidirectional="sliding", window=int(backbone_config["sliding_window_size"]))
    return dict(keras_hub_image=image)


def audio_fields(preset, backbone_config, tokenizer, converter):
    # Its tokenizer knows the audio pieces whether or not it was built with
    # `has_audio_tokens` (its preprocessor looks them up by name). A clip
    # takes one token per 4 valid frames (`audio_format.clip_tokens`).
    pieces = ("<|audio>", "<|audio|>", "<audio|>")
    if any(tokenizer.id_to_token(tokenizer.token_to_id(piece)) != piece for piece in pieces):
        return {}
    start, token, end = pieces
    audio = dict(
        placeholder=token,
        start_token=start,
        audio_token=token,
        end_token=end,
        newlines="",
        tokens_per_clip=int(backbone_config.get("num_audio_tokens_per_clip") or 750),
        frame_stride=int(converter.stride),
        sampling_rate=int(converter.sampling_rate),
        max_samples=int(converter.num_samples),
    )
    return dict(keras_hub_audio=audio)


def video_fields(preset, tokenizer):
    # No video encoder: its preprocessor samples `num_frames` frames with
    # the converter, and the vision encoder takes each as an image of at
    # most `max_soft_tokens` (70) pooled patches (`video.py`).
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
        fps=preprocessor_fps(preset, DEFAULT_FPS),
        tokens_per_video=num_frames * (max_soft_tokens + 2 + TIMESTAMP_TOKENS),
        layout="gemma4",
    )
    return dict(keras_hub_video=video)

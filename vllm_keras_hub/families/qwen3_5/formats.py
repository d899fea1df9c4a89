"""The image and video formats of a Qwen3.5 (or Qwen3.5-MoE) preset's
model folder.

Each returns its `config.json` fields (`export/image_format.py` and
`video_format.py` say what they mean), or `{}` where the preset does not
take that modality.
"""

import math

from vllm_keras_hub.export.image_format import load_image_converter
from vllm_keras_hub.export.video_format import load_video_converter
from vllm_keras_hub.export.video_format import preprocessor_fps

# vLLM's video loader's frames per video by default, which a Qwen3.5
# converter (it samples none itself) takes all of.
FRAMES = 32
# A timestamp's tokens, at most: `<123.4 seconds>`, one a character.
TIMESTAMP_TOKENS = 16


def image_fields(preset, backbone_config, tokenizer):
    """Qwen3.5: `<|image_pad|>` expands to one per merged patch of its image.

    The prompt (its chat template) writes `<|vision_start|><|image_pad|>
    <|vision_end|>`, and `Qwen3_5CausalLMPreprocessor` repeats the pad once
    per soft token, which varies with the image's size. The most an image
    takes is the converter's largest square (`max_pixels`), as vLLM's own
    Qwen3.5 bounds it; M-RoPE positions (`rope_parameters`, which vLLM reads
    to hand the model 3 position rows) place each soft token by its row and
    column.
    """
    converter = load_image_converter(preset)
    if (
        not backbone_config.get("vision_encoder")
        or converter is None
        or getattr(tokenizer, "image_token_id", None) is None
    ):
        return {}
    side = int(math.isqrt(int(converter.max_pixels)))
    stride = converter.patch_size * converter.spatial_merge_size
    image = dict(
        placeholder=tokenizer.image_token,
        start_token=None,
        image_token=tokenizer.image_token,
        end_token=None,
        newlines="",
        tokens_per_image=(side // stride) ** 2,
        image_size=side,
        bidirectional=None,
        window=None,
    )
    fields = dict(keras_hub_image=image)
    section = backbone_config.get("mrope_section")
    if section:
        fields["rope_parameters"] = dict(
            rope_type="default", mrope_section=list(section), mrope_interleaved=True
        )
    return fields


def video_fields(preset, tokenizer):
    """A Qwen3.5 preset's video format: `FRAMES` frames a video.

    Its converter keeps the frames' pixels in all within `max_pixels`
    (each side a whole number of merge windows), two frames a patch.
    """
    converter = load_video_converter(preset)
    if converter is None or getattr(tokenizer, "video_token_id", None) is None:
        return {}
    stride = converter.patch_size * converter.spatial_merge_size
    temporal = converter.temporal_patch_size
    patches = -(-FRAMES // temporal)
    max_soft_tokens = converter.max_pixels // (temporal * stride**2)
    video = dict(
        placeholder=tokenizer.video_token,
        start_token=tokenizer.vision_start_token,
        video_token=tokenizer.video_token,
        end_token=tokenizer.vision_end_token,
        num_frames=FRAMES,
        max_soft_tokens=int(max_soft_tokens),
        patch_size=int(converter.patch_size),
        pooling=int(converter.spatial_merge_size),
        # `Qwen3_5CausalLMPreprocessor`'s default.
        fps=preprocessor_fps(preset, 2.0),
        tokens_per_video=int(max_soft_tokens + patches * (2 + TIMESTAMP_TOKENS)),
        layout="qwen3_5",
    )
    return dict(keras_hub_video=video)

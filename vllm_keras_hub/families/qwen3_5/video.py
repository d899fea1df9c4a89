"""Qwen3.5 videos: all their frames, two a patch, a timestamped span per pair.

The video layout `"qwen3_5"` (`export/video_format.py`). The preset's video
converter cuts all the frames it is given into patches of 2 frames, merged
2x2 into soft tokens within its pixel budget over all frames (`to_inputs`),
and each pair of frames is `<t seconds><|vision_start|>` + `<|video_pad|>`
per soft token + `<|vision_end|>` (`video_span`), placed as an image by
M-RoPE (`inputs.frame_images`).
"""

import math

import numpy as np
import torch
from keras import ops
from keras_hub.src.models.qwen3_5.qwen3_5_causal_lm_preprocessor import (
    Qwen3_5CausalLMPreprocessor,
)

from vllm_keras_hub.families.qwen3_5.inputs import soft_tokens
from vllm_keras_hub.models.video import VideoSpan
from vllm_keras_hub.models.video import checked_frames
from vllm_keras_hub.models.video import video_converter


def to_inputs(preset, video, items):
    """The converter on each video: all its frames, two a patch.

    Args:
        preset: The KerasHub preset.
        video: The preset's `keras_hub_video` format.
        items: vLLM's parsed videos: `(frames, metadata)` pairs
            (`models/video.checked_frames`).

    Returns:
        `video_pixel_values`, every video's patches one after another,
        `video_grid_thw`, one `(t, h, w)` row per video, and
        `video_timestamps`, each video's pairs of frames' times in seconds
        one after another, as `Qwen3_5CausalLMPreprocessor.
        _calculate_timestamps` computes them from the frames' source
        indices and frame rate.
    """
    converter = video_converter(preset)
    patches, grids, stamps = [], [], []
    for frames, metadata in items:
        frames, indices, fps = checked_frames(frames, metadata, video["fps"])
        converted = converter(frames)
        grid = ops.convert_to_numpy(converted["grid_thw"]).astype("int64")
        times = Qwen3_5CausalLMPreprocessor._calculate_timestamps(
            indices, fps, converter.temporal_patch_size
        )
        patches.append(ops.convert_to_numpy(converted["patches"]))
        grids.append(grid)
        stamps.append(np.array(times[: grid[0]], "float64"))
    return {
        "video_pixel_values": torch.from_numpy(np.concatenate(patches)),
        "video_grid_thw": torch.from_numpy(np.stack(grids)),
        "video_timestamps": torch.from_numpy(np.concatenate(stamps)),
    }


def video_span(tokenizer, video, fields):
    """A video's span, as `_expand_video_prompt` writes it: per pair of
    frames, `<t seconds><|vision_start|>` + one `<|video_pad|>` per soft
    token + `<|vision_end|>`.

    It replaces the prompt's `<|vision_start|><|video_pad|><|vision_end|>`
    whole (`collapse_markers`). Special tokens split both tokenizers'
    text, so each later timestamp is tokenized alone; the first is text
    KerasHub tokenizes with the prompt's text before it (`VideoSpan.lead`).

    Args:
        tokenizer: vLLM's tokenizer of the preset.
        video: The preset's `keras_hub_video` format.
        fields: The video's processed fields (`to_inputs`).
    """
    vocab = tokenizer.get_vocab()
    _, h, w = fields["video_grid_thw"].data.tolist()
    count = soft_tokens((1, h, w), video["pooling"])
    frame = [vocab[video["start_token"]], *[vocab[video["video_token"]]] * count]
    frame.append(vocab[video["end_token"]])
    stamps = [f"<{t:.1f} seconds>" for t in fields["video_timestamps"].data.tolist()]
    full = list(frame)
    for stamp in stamps[1:]:
        full += tokenizer.encode(stamp, add_special_tokens=False) + frame
    if len(full) + len(stamps[0]) > video["tokens_per_video"]:
        raise ValueError(
            f"This video's span takes {len(full)} tokens and its first "
            f"timestamp, more than the {video['tokens_per_video']} a video "
            f"may take here ({video['num_frames']} frames within the "
            "converter's pixels); give fewer frames."
        )
    soft = vocab[video["video_token"]]
    return VideoSpan(full=full, is_embed=lambda ids: torch.tensor(ids) == soft, lead=stamps[0])


def collapse_markers(token_ids, video, vocab):
    """The prompt's ids with each `<|vision_start|><|video_pad|>
    <|vision_end|>` as its `<|video_pad|>` alone, which `video_span`
    replaces with the whole span, as the preprocessor replaces the three."""
    marker = [vocab[video[key]] for key in ("start_token", "video_token", "end_token")]
    ids, i = [], 0
    while i < len(token_ids):
        if list(token_ids[i : i + 3]) == marker:
            ids.append(marker[1])
            i += 3
        else:
            ids.append(token_ids[i])
            i += 1
    return ids


def dummy_frame_side(video):
    """The side of the square frames that take a video's most soft tokens."""
    stride = video["patch_size"] * video["pooling"]
    pixels = video["max_soft_tokens"] * 2 * stride**2
    return max(stride, math.isqrt(pixels // video["num_frames"]))

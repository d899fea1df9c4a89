"""Gemma4 videos: frames as its preprocessor samples them, spans as it writes them.

(Qwen3.5's videos: `patches.py`.)

Gemma4 has no video encoder. `Gemma4CausalLMPreprocessor` hands a video to
the preset's `Gemma4VideoConverter`, which keeps `num_frames` frames
spread evenly over it and converts each as an image of at most 70 pooled
patches; each `<|video|>` in the prompt becomes one span per frame,
`mm:ss <|image>` + one `<|video|>` per soft token + `<image|>`, joined by
spaces, the timestamps read from each frame's source index and the video's
frame rate (its `video_metadata`); the vision encoder embeds each frame,
and its first soft tokens take the `<|video|>` places.

Here vLLM decodes the video (`video_url`: its OpenCV loader, with the
source indices and frame rate of the frames it keeps), the same converter
keeps and converts the frames (`to_frames`), and the span is written from
the processed fields (`video_span`), which vLLM's processor cache keeps.
The span's first timestamp is text that KerasHub tokenizes with the
prompt's text before it, so it travels beside the span's ids as text
(`VideoSpan.lead`) and is merged there (`placeholders.expand_placeholders`).
"""

import dataclasses
import functools

import numpy as np
import torch
from vllm.multimodal.processing.processor import PromptUpdateDetails

from vllm_keras_hub.export.video_format import TIMESTAMP_TOKENS
from vllm_keras_hub.export.video_format import frame_tokens
from vllm_keras_hub.export.video_format import replacement


@functools.lru_cache(maxsize=4)
def _video_converter(preset):
    from vllm_keras_hub.backend import default_to_torch

    default_to_torch()
    from vllm_keras_hub.export.video_format import load_video_converter
    from vllm_keras_hub.preset import served

    return load_video_converter(served(preset))


def kept_frames(total, num_frames):
    """The indices of the frames the converter keeps of `total`: its own
    `linspace(0, total - 1, num_frames)`, cast to int32."""
    from keras import ops

    indices = ops.cast(ops.linspace(0, total - 1, num_frames), "int32")
    return ops.convert_to_numpy(indices).tolist()


def to_frames(preset, video, items):
    """The preset's video converter on each video, as the model's inputs.

    Args:
        preset: The KerasHub preset.
        video: The preset's `keras_hub_video` format.
        items: vLLM's parsed videos: `(frames, metadata)` pairs, `frames`
            an array of `(frames, height, width, 3)` pixels, `metadata`
            vLLM's (`frames_indices`: each frame's index in the source;
            `fps`: the source's frame rate, else the format's `fps`).

    Returns:
        A dict of tensors, one row per video: `video_pixel_values`
        (`(videos, num_frames, patches, 3 * patch_size**2)`),
        `video_pixel_position_ids` (`(videos, num_frames, patches, 2)`),
        `video_frame_tokens` (each frame's soft tokens), and the
        timestamps' inputs: `video_frame_indices` (each kept frame's index
        in the source) and `video_fps` (the source's frame rate).
    """
    from keras import ops

    converter = _video_converter(preset)
    rows = []
    for frames, metadata in items:
        frames, indices, fps = checked_frames(frames, metadata, video["fps"])
        kept = kept_frames(len(frames), video["num_frames"])
        converted = converter._process_single_video(frames)
        rows.append(
            {
                "video_pixel_values": ops.convert_to_numpy(converted["pixel_values"])[0],
                "video_pixel_position_ids": ops.convert_to_numpy(
                    converted["pixel_position_ids"]
                )[0],
                "video_frame_tokens": np.int64(frame_tokens(video, *frames.shape[1:3])),
                "video_frame_indices": np.array([indices[i] for i in kept], "int64"),
                "video_fps": np.float64(fps),
            }
        )
    return {key: torch.from_numpy(np.stack([row[key] for row in rows])) for key in rows[0]}


def checked_frames(frames, metadata, default_fps):
    """A video's frames as float32, its frames' source indices and frame rate.

    Args:
        frames: `(frames, height, width, 3)` pixels.
        metadata: vLLM's (`frames_indices`, `fps`).
        default_fps: The frame rate where the metadata gives none.

    Raises:
        ValueError: frames that are not RGB, or indices not one a frame.
    """
    frames = np.asarray(frames, "float32")
    if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(
            f"A video must be frames of RGB pixels, (frames, height, "
            f"width, 3); got an array of shape {frames.shape}."
        )
    indices = list(metadata.get("frames_indices") or range(len(frames)))
    if len(indices) != len(frames):
        raise ValueError(
            f"The video's metadata gives {len(indices)} frame indices "
            f"for its {len(frames)} frames."
        )
    return frames, indices, float(metadata.get("fps") or default_fps)


@dataclasses.dataclass
class VideoSpan(PromptUpdateDetails):
    """A video's span from its first `<|image>` on; `lead`, the text before
    it (the first frame's timestamp), is tokenized with the prompt's text."""

    lead: str = ""


def video_span(tokenizer, video, fields):
    """The span a video's placeholder expands to, from its processed fields.

    Args:
        tokenizer: vLLM's tokenizer of the preset.
        video: The preset's `keras_hub_video` format.
        fields: The video's processed fields (`to_frames`).

    Returns:
        A `VideoSpan` whose embeddings go to its `<|video|>` tokens.
    """
    text = replacement(
        int(fields["video_frame_tokens"].data),
        fields["video_frame_indices"].data.tolist(),
        float(fields["video_fps"].data),
    )
    # Special tokens split both tokenizers' text, so the span from the first
    # `<|image>` on is tokenized alone; the first timestamp before it is not.
    lead, start, rest = text.partition(video["start_token"])
    full = tokenizer.encode(start + rest, add_special_tokens=False)
    if len(full) + TIMESTAMP_TOKENS > video["tokens_per_video"]:
        raise ValueError(
            f"This video's span takes {len(full)} tokens and its first "
            f"timestamp, more than the {video['tokens_per_video']} vLLM was "
            "given as a video's most: its timestamps are too long."
        )
    soft = tokenizer.get_vocab()[video["video_token"]]
    return VideoSpan(full=full, is_embed=lambda ids: torch.tensor(ids) == soft, lead=lead)


def embed_video(backbone, pixel_values, pixel_position_ids, count):
    """A video's embeddings, as `Gemma4Backbone` places them.

    Args:
        backbone: The Gemma4 backbone.
        pixel_values: The video's converted frames, `(frames, patches, dim)`.
        pixel_position_ids: Their patches' positions.
        count: Each frame's soft tokens.

    Returns:
        `(frames * count, hidden)`: each frame's first `count` pooled
        embeddings (`Gemma4InterleaveEmbeddings` keeps those of each frame),
        pre-scaled by 1/sqrt(hidden) as the backbone scales images.
    """
    pooled = backbone.vision_encoder(
        {
            "pixel_values": pixel_values[None],
            "pixel_position_ids": pixel_position_ids[None].int(),
        }
    )[0]
    embeddings = pooled[:, : int(count)].reshape(-1, pooled.shape[-1])
    scale = float(backbone.hidden_dim) ** -0.5
    return embeddings * torch.tensor(scale, dtype=embeddings.dtype)

"""Gemma4 videos: frames as its preprocessor samples them, spans as it writes them.

The video layout `"gemma4"` (`export/video_format.py`). Gemma4 has no
video encoder. `Gemma4CausalLMPreprocessor` hands a video to the preset's
`Gemma4VideoConverter`, which keeps `num_frames` frames spread evenly over
it and converts each as an image of at most 70 pooled patches; each
`<|video|>` in the prompt becomes one span per frame, `mm:ss <|image>` +
one `<|video|>` per soft token + `<image|>`, joined by spaces, the
timestamps read from each frame's source index and the video's frame rate
(its `video_metadata`); the vision encoder embeds each frame, and its first
soft tokens take the `<|video|>` places.

Here vLLM decodes the video (`video_url`: its OpenCV loader, with the
source indices and frame rate of the frames it keeps), the same converter
keeps and converts the frames (`to_inputs`), the span is written from the
processed fields (`video_span`), which vLLM's processor cache keeps, and
the model embeds each video's frames (`embed_video`). The span's first
timestamp is text that KerasHub tokenizes with the prompt's text before
it, so it travels beside the span's ids as text (`VideoSpan.lead`) and is
merged there (`placeholders.expand_placeholders`).
"""

import numpy as np
import torch
from keras import ops
from keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor import (
    Gemma4CausalLMPreprocessor,
)
from keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor import _get_num_vision_tokens

from vllm_keras_hub.families.gemma4.formats import TIMESTAMP_TOKENS
from vllm_keras_hub.models.video import VideoSpan
from vllm_keras_hub.models.video import checked_frames
from vllm_keras_hub.models.video import video_converter


def frame_tokens(video, height, width):
    """A frame's soft tokens, as `Gemma4CausalLMPreprocessor` counts them
    from the frame's size (its own `_get_num_vision_tokens`)."""
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
    return Gemma4CausalLMPreprocessor._build_video_replacement(
        None, count, frames_indices, fps
    )


def kept_frames(total, num_frames):
    """The indices of the frames the converter keeps of `total`: its own
    `linspace(0, total - 1, num_frames)`, cast to int32."""
    indices = ops.cast(ops.linspace(0, total - 1, num_frames), "int32")
    return ops.convert_to_numpy(indices).tolist()


def to_inputs(preset, video, items):
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
    converter = video_converter(preset)
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


def video_span(tokenizer, video, fields):
    """The span a video's placeholder expands to, from its processed fields.

    Args:
        tokenizer: vLLM's tokenizer of the preset.
        video: The preset's `keras_hub_video` format.
        fields: The video's processed fields (`to_inputs`).

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

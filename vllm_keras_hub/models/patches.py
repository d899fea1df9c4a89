"""Images and videos cut into patches that merge into a varying number of
soft tokens (Qwen3.5's), and the M-RoPE positions that place those tokens.

The preset's own `Qwen3_5ImageConverter` resizes each image within its
pixel budget and cuts it into patches, with its `(t, h, w)` grid
(`to_patches`); `<|image_pad|>` expands to one pad per merged patch
(`soft_tokens`), as `Qwen3_5CausalLMPreprocessor` expands it; and each
prompt's three rows of positions are the preprocessor's
(`mrope_positions`). A video is all its frames, two a patch
(`to_video_patches`), each pair of frames a timestamped span placed as an
image (`video_span`, `frame_images`). The model class is `mrope.py`'s.
"""

import math

import numpy as np
import torch


def merges_patches(converter):
    """Whether `converter` cuts images into patches merged into soft
    tokens by the encoder, a varying number per image (Qwen3.5's)."""
    return hasattr(converter, "spatial_merge_size")


def to_patches(converter, images):
    """The converter on each image: its patches and `(t, h, w)` grid.

    Args:
        converter: The preset's `Qwen3_5ImageConverter`.
        images: PIL images.

    Returns:
        `pixel_values`, every image's patches one after another
        (`(patches, temporal_patch_size, patch_size, patch_size, 3)`), and
        `image_grid_thw`, one row per image, in patches.
    """
    from keras import ops

    patches, grids = [], []
    for image in images:
        converted = converter(np.asarray(image.convert("RGB"), "float32"))
        patches.append(ops.convert_to_numpy(converted["patches"]))
        grids.append(ops.convert_to_numpy(converted["grid_thw"]))
    return {
        "pixel_values": torch.from_numpy(np.concatenate(patches)),
        "image_grid_thw": torch.from_numpy(np.stack(grids).astype("int64")),
    }


def soft_tokens(grid, merge_size):
    """An image's soft tokens: its patches over the merge window's."""
    t, h, w = (int(x) for x in grid)
    return t * (h // merge_size) * (w // merge_size)


def image_count(image, grid, merge_size):
    """A Qwen3.5 image's soft tokens, from its `(t, h, w)` grid.

    Args:
        image: The preset's image format (`export/image_format.py`).
        grid: The image's grid, in patches.
        merge_size: The encoder's spatial merge.

    Raises:
        ValueError: more than the format's `tokens_per_image`, which vLLM
            sizes its budgets by (the converter rounds each side to whole
            merge windows, so a long, thin image may exceed its pixels).
    """
    count = soft_tokens(grid, merge_size)
    if count > image["tokens_per_image"]:
        raise ValueError(
            f"This image takes {count} soft tokens (a grid of {list(map(int, grid))} "
            f"patches), more than the {image['tokens_per_image']} an image may "
            "take here; give one of a less extreme aspect ratio."
        )
    return count


def mrope_positions(num_tokens, images, merge_size):
    """A prompt's M-RoPE positions, as `Qwen3_5CausalLMPreprocessor.
    _compute_position_ids` computes them (its channels 1 to 3).

    Text tokens count up in all three rows. An image's soft tokens all take
    the next position in the temporal row, plus their row in the height
    row and their column in the width row; the text after it goes on from
    the next position plus the larger of its rows and columns.

    Args:
        num_tokens: The prompt's length.
        images: `(offset, grid)` of each image: its first soft token's
            index and its `(t, h, w)` grid in patches.
        merge_size: The encoder's spatial merge.

    Returns:
        `(positions, delta)`: `(3, num_tokens)` int64 positions, and what
        the positions after the prompt add to their index.
    """
    rows, start, position = [], 0, 0
    for offset, grid in sorted(images, key=lambda image: image[0]):
        text = offset - start
        rows.append(np.broadcast_to(np.arange(text) + position, (3, text)))
        position += text
        _, h, w = (int(x) // merge_size for x in grid)
        rows.append(np.indices((1, h, w)).reshape(3, -1) + position)
        position += max(h, w)
        start = offset + h * w
    rows.append(np.broadcast_to(np.arange(num_tokens - start) + position, (3, num_tokens - start)))
    positions = np.concatenate(rows, axis=1).astype("int64")
    return torch.from_numpy(positions), int(positions.max(initial=-1)) + 1 - num_tokens


def to_video_patches(converter, video, items):
    """The converter on each video: all its frames, two a patch.

    Args:
        converter: The preset's `Qwen3_5VideoConverter`.
        video: The preset's `keras_hub_video` format.
        items: vLLM's parsed videos: `(frames, metadata)` pairs (as
            `video.to_frames` takes them).

    Returns:
        `video_pixel_values`, every video's patches one after another,
        `video_grid_thw`, one `(t, h, w)` row per video, and
        `video_timestamps`, each video's pairs of frames' times in seconds
        one after another, as `Qwen3_5CausalLMPreprocessor.
        _calculate_timestamps` computes them from the frames' source
        indices and frame rate.
    """
    from keras import ops
    from keras_hub.src.models.qwen3_5.qwen3_5_causal_lm_preprocessor import (
        Qwen3_5CausalLMPreprocessor,
    )

    from vllm_keras_hub.models.video import checked_frames

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
    whole (`collapse_video_markers`). Special tokens split both tokenizers'
    text, so each later timestamp is tokenized alone; the first is text
    KerasHub tokenizes with the prompt's text before it (`VideoSpan.lead`).

    Args:
        tokenizer: vLLM's tokenizer of the preset.
        video: The preset's `keras_hub_video` format.
        fields: The video's processed fields (`to_video_patches`).
    """
    from vllm_keras_hub.models.video import VideoSpan

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


def collapse_video_markers(token_ids, video, vocab):
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


def frame_images(input_tokens, offset, grid, vision_start):
    """A video's pairs of frames as images for `mrope_positions`: each its
    pads' first index after its `<|vision_start|>`, and a grid of one."""
    t, h, w = grid
    images = []
    for _ in range(int(t)):
        start = input_tokens.index(vision_start, offset) + 1
        images.append((start, (1, h, w)))
        offset = start
    return images


def dummy_frame_side(video):
    """The side of the square frames that take a video's most soft tokens."""
    stride = video["patch_size"] * video["pooling"]
    pixels = video["max_soft_tokens"] * 2 * stride**2
    return max(stride, math.isqrt(pixels // video["num_frames"]))

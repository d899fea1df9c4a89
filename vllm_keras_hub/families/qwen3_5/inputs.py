"""Qwen3.5 images cut into patches that merge into a varying number of
soft tokens, and the M-RoPE positions that place those tokens.

The preset's own `Qwen3_5ImageConverter` resizes each image within its
pixel budget and cuts it into patches, with its `(t, h, w)` grid
(`to_pixels`); `<|image_pad|>` expands to one pad per merged patch
(`soft_tokens`), as `Qwen3_5CausalLMPreprocessor` expands it; and each
prompt's three rows of positions are the preprocessor's
(`mrope_positions`). A pair of a video's frames is placed as an image
(`frame_images`, `video.py`). The model class is `media.py`'s.
"""

import numpy as np
import torch
from keras import ops


def to_pixels(converter, images, image=None):
    """The converter on each image: its patches and `(t, h, w)` grid.

    Args:
        converter: The preset's `Qwen3_5ImageConverter`.
        images: PIL images.
        image: The preset's image format, to refuse an image of more soft
            tokens than it bounds (`image_count`); `None`: unchecked.

    Returns:
        `pixel_values`, every image's patches one after another
        (`(patches, temporal_patch_size, patch_size, patch_size, 3)`), and
        `image_grid_thw`, one row per image, in patches.
    """
    patches, grids = [], []
    for item in images:
        converted = converter(np.asarray(item.convert("RGB"), "float32"))
        patches.append(ops.convert_to_numpy(converted["patches"]))
        grids.append(ops.convert_to_numpy(converted["grid_thw"]))
        if image is not None:
            image_count(image, grids[-1], converter.spatial_merge_size)
    return {
        "pixel_values": torch.from_numpy(np.concatenate(patches)),
        "image_grid_thw": torch.from_numpy(np.stack(grids).astype("int64")),
    }


def image_tokens(image, item, converter):
    """An image's soft tokens, from its processed fields (vLLM's processor
    cache keeps those, not the image)."""
    return image_count(image, item["image_grid_thw"].data, converter.spatial_merge_size)


def fields_config(hf_inputs, flat):
    """vLLM's field configs where an item is a varying number of rows: an
    image's or video's patches, a video's timestamps (one per pair of
    frames)."""
    fields = {}
    if "image_grid_thw" in hf_inputs:
        fields["pixel_values"] = flat("image", hf_inputs["image_grid_thw"].prod(-1))
    if "video_grid_thw" in hf_inputs:
        grids = hf_inputs["video_grid_thw"]
        fields["video_pixel_values"] = flat("video", grids.prod(-1))
        fields["video_timestamps"] = flat("video", grids[:, 0])
    return fields


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

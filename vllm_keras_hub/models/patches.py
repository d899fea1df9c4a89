"""Images cut into patches that merge into a varying number of soft tokens
(Qwen3.5's), and the M-RoPE positions that place those tokens.

The preset's own `Qwen3_5ImageConverter` resizes each image within its
pixel budget and cuts it into patches, with its `(t, h, w)` grid
(`to_patches`); `<|image_pad|>` expands to one pad per merged patch
(`soft_tokens`), as `Qwen3_5CausalLMPreprocessor` expands it; and each
prompt's three rows of positions are the preprocessor's
(`mrope_positions`). The model class is `mrope.py`'s.
"""

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

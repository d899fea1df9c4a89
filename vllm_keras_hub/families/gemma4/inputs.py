"""Gemma4 images and clips as its preprocessor converts them.

Its image converter cuts each image into patches, padded by its aspect
ratio, with their positions; its audio converter pads every clip to 30 s.
"""

import numpy as np
import torch
from keras import ops


def to_pixels(converter, images, image=None):
    """The converter on each image: `pixel_values`, `(num_images, patches,
    3 * patch_size**2)`, and int32 `pixel_position_ids`, `(num_images,
    patches, 2)`, -1 for padding. Every image takes `max_soft_tokens`."""
    rows = []
    for item in images:
        # It takes a batch: its resize reads the batch's height and width.
        converted = converter(np.asarray(item.convert("RGB"), "float32")[None])
        rows.append({k: ops.convert_to_numpy(v)[0] for k, v in converted.items()})
    return {key: torch.from_numpy(np.stack([row[key] for row in rows])) for key in rows[0]}


def clip_features(converter, clip):
    """`(features, padding)` of one clip: the converter pads it to 30 s of
    frames, and its preprocessor counts `samples // stride` valid."""
    features = ops.convert_to_numpy(converter(clip)).astype("float32")
    padding = np.arange(len(features)) >= len(clip) // converter.stride
    return features, padding

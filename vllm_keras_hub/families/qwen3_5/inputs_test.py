"""Qwen3.5's image fields and M-RoPE positions, against its own preprocessor."""

import numpy as np
import pytest

from vllm_keras_hub.export.video_format import load_video_converter
from vllm_keras_hub.families.qwen3_5.inputs import frame_images
from vllm_keras_hub.families.qwen3_5.inputs import image_count
from vllm_keras_hub.families.qwen3_5.inputs import mrope_positions
from vllm_keras_hub.families.qwen3_5.inputs import to_pixels
from vllm_keras_hub.testing import mrope_oracle
from vllm_keras_hub.testing.image_oracle import image_parts
from vllm_keras_hub.testing.images import IMAGES
from vllm_keras_hub.testing.images import random_image
from vllm_keras_hub.testing.videos import random_video
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    preset = build_tiny_vision_preset(
        str(tmp_path_factory.mktemp("qwen3_5")), "qwen3_5", video=True
    )
    _, tokenizer, converter = image_parts(preset)
    videos = load_video_converter(preset)
    return mrope_oracle._preprocessor(tokenizer, converter, videos), converter


@pytest.mark.parametrize(
    "text, images",
    [
        ("Hello there", []),
        (f"{IMAGE} first", [IMAGES[0]]),
        (f"a {IMAGE} wide and {IMAGE} tall, compared", [IMAGES[2], IMAGES[1]]),
        (f"last {IMAGE}", [random_image(7, 96, 96)]),
    ],
    ids=["text", "image-first", "two-images", "image-last"],
)
def test_positions_are_the_preprocessors(parts, text, images):
    """The three rows equal `_compute_position_ids`'s channels 1 to 3
    (its channel 0 is the first again), and the delta continues them
    past the prompt."""
    preprocessor, converter = parts
    ids, media = mrope_oracle.prompt_inputs(preprocessor, converter, text, images)
    grids = media.get("image_grid_thw", np.zeros((0, 3), "int32"))
    theirs = mrope_oracle._position_ids(preprocessor, np.array([ids]), grids)[0]
    soft = preprocessor.image_token_id
    starts = [i for i, t in enumerate(ids) if t == soft and (i == 0 or ids[i - 1] != soft)]
    ours, delta = mrope_positions(len(ids), list(zip(starts, grids.tolist())), 2)
    np.testing.assert_array_equal(ours.numpy(), theirs[1:])
    # The prompt plus one token, as the preprocessor places it.
    longer = mrope_oracle._position_ids(preprocessor, np.array([ids + [0]]), grids)[0]
    assert longer[1, -1] == len(ids) + delta
    assert (delta < 0) == bool(images)


@pytest.mark.parametrize("frames", [4, 5])
def test_video_positions_are_the_preprocessors(parts, frames):
    """Each pair of frames placed as an image after its `<|vision_start|>`
    (`frame_images`), the timestamps between them as text: the rows equal
    `_compute_position_ids`'s for the video (5 frames: 3 pairs, the last
    frame repeated)."""
    preprocessor, _ = parts
    text = "Watch <|vision_start|><|video_pad|><|vision_end|> now"
    ids, media = mrope_oracle.prompt_inputs(
        preprocessor, None, text, random_video(frames, frames=frames)
    )
    grid = media["image_grid_thw"]
    theirs = mrope_oracle._position_ids(preprocessor, np.array([ids]), None, grid)[0]
    start = ids.index(preprocessor.tokenizer.vision_start_token_id)
    images = frame_images(ids, start, grid[0].tolist(), ids[start])
    assert len(images) == (frames + 1) // 2
    ours, _ = mrope_positions(len(ids), images, 2)
    np.testing.assert_array_equal(ours.numpy(), theirs[1:])


def test_the_fields_are_the_converters_own(parts):
    _, converter = parts
    fields = to_pixels(converter, IMAGES)
    grids = fields["image_grid_thw"].tolist()
    assert grids == [[1, 4, 6], [1, 8, 4], [1, 2, 10]]
    sizes = [t * h * w for t, h, w in grids]
    for image, patches in zip(IMAGES, fields["pixel_values"].split(sizes), strict=True):
        own = converter(np.asarray(image, "float32"))["patches"]
        np.testing.assert_array_equal(patches.numpy(), np.asarray(own))


def test_an_image_over_the_format_s_most_tokens_is_refused():
    image = {"tokens_per_image": 36}
    assert image_count(image, [1, 12, 12], 2) == 36
    with pytest.raises(ValueError, match="takes 60 soft tokens .* more than the 36"):
        image_count(image, [1, 2, 120], 2)

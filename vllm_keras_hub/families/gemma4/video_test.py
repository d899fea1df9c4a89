"""A video's fields as the processor makes them, against the preset's converter."""

import numpy as np
import pytest

from vllm_keras_hub.families.gemma4.video import kept_frames
from vllm_keras_hub.families.gemma4.video import to_inputs
from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset
from vllm_keras_hub.testing.videos import random_video


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return build_tiny_vision_preset(
        str(tmp_path_factory.mktemp("gemma4_video")), "gemma4", video=True
    )


def _format(preset):
    import keras_hub

    from vllm_keras_hub.export.video_format import video_fields

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    return video_fields(preset, "Gemma4Backbone", tokenizer, True)["keras_hub_video"]


def test_the_frames_kept_are_the_converters_own(preset):
    """Of 10 frames the converter keeps 4 (`linspace`, cast): the fields
    hold those frames' pixels, converted as the converter converts them,
    and their indices in the source."""
    from vllm_keras_hub.models.video import video_converter

    video = _format(preset)
    ten = random_video(0, frames=10, fps=3.0, stride=7)
    fields = to_inputs(preset, video, [ten])
    kept = kept_frames(10, 4)
    assert kept == [0, 3, 6, 9]
    alone = video_converter(preset)._process_single_video(
        np.asarray(ten.frames[kept], "float32")
    )
    np.testing.assert_array_equal(fields["video_pixel_values"][0], alone["pixel_values"][0])
    assert fields["video_frame_indices"][0].tolist() == [0, 21, 42, 63]
    assert float(fields["video_fps"][0]) == 3.0
    assert fields["video_frame_tokens"].tolist() == [63]


def test_frames_that_are_not_rgb_or_indices_that_do_not_match_are_refused(preset):
    video = _format(preset)
    gray = random_video(0).frames[..., 0]
    with pytest.raises(ValueError, match="frames of RGB pixels"):
        to_inputs(preset, video, [(gray, {"fps": 2.0})])
    frames = random_video(0).frames
    with pytest.raises(ValueError, match="gives 2 frame indices for its 4 frames"):
        to_inputs(preset, video, [(frames, {"frames_indices": [0, 1], "fps": 2.0})])

"""What every family's videos share in vLLM's front end.

A video's format names its layout (`export/video_format.py`): the family
whose `video.py` (`families.part`) turns vLLM's decoded videos into the
model's inputs (`to_inputs`) and writes each video's span from them
(`video_span`), as that family's preprocessor does. Both read the preset's
video converter (`video_converter`) and each video's frames and their
source indices and frame rate (`checked_frames`).
"""

import dataclasses

import numpy as np
from vllm.multimodal.processing.processor import PromptUpdateDetails

from vllm_keras_hub import families


def layout(video):
    """The module that turns videos of `video`'s layout into inputs and spans.

    Args:
        video: The preset's `keras_hub_video` format.
    """
    return families.part(families.family_by_name(video["layout"]), "video")


def video_converter(preset):
    """The preset's video converter, read once for the served preset."""
    from vllm_keras_hub.export.video_format import load_video_converter
    from vllm_keras_hub.preset import served

    return served(preset).kept(load_video_converter)


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
    """A video's span from its first marker on; `lead`, the text before it
    (the first timestamp), is tokenized with the prompt's text.

    Special tokens split both tokenizers' text, so the span is tokenized
    alone; KerasHub tokenizes its first timestamp with the text before it
    (`placeholders.expand_placeholders` merges it there).
    """

    lead: str = ""

"""Videos, requests and encoded files shared by the video tests."""

import io
from typing import NamedTuple

import numpy as np


class Video(NamedTuple):
    """A decoded video as vLLM's loader hands it on: `frames`, an array of
    `(frames, height, width, 3)` uint8 pixels, and `metadata`, each frame's
    index in the source (`frames_indices`) and the source's `fps`."""

    frames: np.ndarray
    metadata: dict


def random_video(seed, height=48, width=64, frames=4, fps=2.0, stride=50):
    """A video of random frames, the `stride`th of a source at `fps`: their
    timestamps reach past a minute, so the span's `mm:ss` vary."""
    pixels = np.random.default_rng(seed).integers(0, 255, (frames, height, width, 3), np.uint8)
    indices = [i * stride for i in range(frames)]
    metadata = {"frames_indices": indices, "fps": fps, "total_num_frames": indices[-1] + 1}
    return Video(pixels, metadata)


def request(text, images=(), video=None):
    """A `vllm.LLM.generate` prompt with images and a video."""
    data = {}
    if images:
        data["image"] = list(images)
    if video is not None:
        data["video"] = (video.frames, video.metadata)
    return {"prompt": text, "multi_modal_data": data} if data else text


def encoded(video, fps):
    """`video`'s frames as an MPEG-4 file at `fps`, written with PyAV
    (lossy: decode it with `decoded` for what a server sees).

    Returns:
        The file's bytes.
    """
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=int(fps))
        stream.height, stream.width = video.frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for pixels in video.frames:
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def decoded(data, num_frames):
    """What vLLM's server makes of a video file: its OpenCV loader's frames
    and metadata, keeping `num_frames` (as `serve` sets it)."""
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    loaded = VideoMediaIO(ImageMediaIO(), num_frames=num_frames).load_bytes(data)
    return Video(*loaded.media)


def video_positions(preset, ids):
    """The positions of the video soft tokens in `ids`."""
    import keras_hub

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    # Gemma4's `<|video|>`, Qwen3.5's `<|video_pad|>`.
    pad = getattr(tokenizer, "video_placeholder", None) or tokenizer.video_token
    soft_token = tokenizer.token_to_id(pad)
    return [i for i, token in enumerate(ids) if token == soft_token]

"""vLLM 0.32's PyAV audio loader returns integer samples unscaled."""

import math

# Where PyAV's integer sample formats (packed or planar) put -1 and 1.
_SCALE = {"u8": (128.0, 128.0), "s16": (0.0, 2.0**15), "s32": (0.0, 2.0**31), "s64": (0.0, 2.0**63)}


def _stream(path):
    """The first audio stream's sample format (planarity aside) and rate."""
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            return None, None
        stream = container.streams.audio[0]
        return stream.codec_context.format.name.rstrip("p"), stream.rate


def scale_integer_samples():
    """Works around vLLM 0.32's PyAV loader returning integer samples unscaled.

    `load_audio_pyav` converts each decoded frame to float only when it
    resamples (to float planar); at the file's own rate, which is how the
    server loads every clip (`AudioMediaIO.load_bytes`, `sr=None`), a 16-bit
    WAV or FLAC file's samples come out as integers in [-32768, 32767]
    instead of [-1, 1]. Every model then hears the clip 90 dB too loud (an
    MP3 decodes to float and is right). This scales them as PyAV's own
    resampler would, in this process.

    Remove when vLLM's `load_audio_pyav` scales integer sample formats
    itself.
    """
    from vllm.multimodal.media import audio

    if hasattr(audio, "_keras_hub_unscaled"):
        return
    load = audio.load_audio_pyav

    def load_audio_pyav(path, *, sr=22050, **kwargs):
        fmt, native = _stream(path)
        if hasattr(path, "seek"):
            path.seek(0)
        samples, rate = load(path, sr=sr, **kwargs)
        # Only frames it resamples come out as float in [-1, 1].
        if fmt in _SCALE and (sr is None or math.isclose(sr, native, abs_tol=1e-6)):
            offset, scale = _SCALE[fmt]
            samples = (samples - offset) / scale
        return samples.astype("float32"), rate

    # `load_audio` calls it by name ("auto") or from its table (`backend=`).
    audio.load_audio_pyav = load_audio_pyav
    audio._AUDIO_LOADERS["pyav"] = load_audio_pyav
    audio._keras_hub_unscaled = load

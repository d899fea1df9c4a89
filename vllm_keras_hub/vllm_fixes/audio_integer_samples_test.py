"""vLLM's PyAV loader, with the fix, reads integer-sample files in [-1, 1]."""

import io

import numpy as np
import pytest

from vllm_keras_hub.testing import audio


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_integer_samples_at_their_own_rate_are_scaled(fmt):
    from vllm.multimodal.media import audio as media
    from vllm.multimodal.media.audio import load_audio

    from vllm_keras_hub.vllm_fixes import audio_integer_samples

    clip = audio.tone_clip(440)
    data = audio.encoded(clip, fmt)
    original = getattr(media, "_keras_hub_unscaled", media.load_audio_pyav)
    raw, _ = original(io.BytesIO(data), sr=None)
    # The bug: 16-bit samples come out as integers.
    assert np.abs(raw).max() > 1000
    audio_integer_samples.scale_integer_samples()
    for sr in (None, 16000, 22050):
        samples, rate = load_audio(io.BytesIO(data), sr=sr, backend="pyav")
        assert rate == (sr or 16000)
        assert np.abs(samples).max() == pytest.approx(0.5, abs=0.01)
    samples, _ = load_audio(io.BytesIO(data), sr=None, backend="pyav")
    assert np.abs(samples - clip).max() < 2.0**-14

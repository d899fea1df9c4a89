"""Gemma4 clips' valid frames and soft tokens, served and in the oracle,
against numbers worked out by hand from keras-hub 0.32's source."""

import numpy as np
import pytest
from keras_hub.src.models.gemma4.gemma4_audio_converter import Gemma4AudioConverter

from vllm_keras_hub.export.audio_format import clip_tokens
from vllm_keras_hub.export.audio_format import frame_tokens
from vllm_keras_hub.families.gemma4.inputs import clip_features
from vllm_keras_hub.testing import audio_oracle

# `Gemma4AudioConverter`'s defaults, which the published and test presets
# keep: 160-sample frames (`stride`) at 16 kHz, padded or cut to 30 s
# (`num_samples` 480000), so 480000 // 160 = 3000 frames.
# `Gemma4CausalLMPreprocessor._preprocess_audio` counts the first
# `samples // 160` frames valid (`tf.sequence_mask(row_lengths // stride,
# maxlen=3000)`), and `generate_preprocess` gives a clip
# `max((valid + 3) // 4, 1)` soft tokens. `(samples, valid, tokens)`:
CLIPS = [
    (160, 1, 1),  # one frame
    (639, 3, 1),  # 639 // 160 = 3; (3 + 3) // 4 = 1
    (6437, 40, 10),  # 0.4 s + 37 samples (`testing/audio.noise_clip`)
    (19237, 120, 30),  # 1.2 s + 37
    (27237, 170, 43),  # 1.7 s + 37: (170 + 3) // 4 = 43
    (96037, 600, 150),  # 6 s + 37
    (496037, 3000, 750),  # 31 s + 37: 3100 frames, cut to the 3000
]
FRAMES = 3000


@pytest.fixture(scope="module")
def converter():
    return Gemma4AudioConverter()


def _clip(samples):
    return np.random.default_rng(samples).standard_normal(samples).astype("float32") * 0.3


def _assert_mask(padding, valid):
    assert padding.shape == (FRAMES,) and padding.dtype == bool
    assert not padding[:valid].any() and padding[valid:].all()


@pytest.mark.parametrize("samples, valid, tokens", CLIPS)
def test_served_mask_and_count(converter, samples, valid, tokens):
    audio = dict(frame_stride=160, max_samples=480000, sampling_rate=16000)
    features, padding = clip_features(converter, _clip(samples))
    assert features.shape == (FRAMES, converter.num_mels)
    _assert_mask(padding, valid)
    # The prompt's tokens, and the embeddings placed at them.
    assert clip_tokens(audio, samples) == frame_tokens(int((~padding).sum())) == tokens


@pytest.mark.parametrize("samples, valid, tokens", CLIPS)
def test_oracle_mask_and_count(converter, samples, valid, tokens):
    clip = _clip(samples)
    features, padding = audio_oracle.clip_inputs(converter, clip)
    assert features.shape == (FRAMES, converter.num_mels)
    _assert_mask(padding, valid)
    assert audio_oracle.soft_tokens(None, converter, clip) == tokens

"""Audio clips, requests and encoded files shared by the audio tests."""

import io

import numpy as np

RATE = 16000


def noise_clip(seed, seconds=0.4):
    """A clip of random samples at 16 kHz; not a multiple of 128 samples
    long, so the converter pads it and masks its last frames."""
    samples = int(seconds * RATE) + 37
    return (np.random.default_rng(seed).standard_normal(samples) * 0.3).astype("float32")


def tone_clip(hertz, seconds=0.4, rate=RATE):
    """A sine tone; its samples fit 16-bit PCM exactly enough to survive a
    WAV file unchanged by more than its quantisation."""
    samples = int(seconds * rate) + 37
    return (0.5 * np.sin(2 * np.pi * hertz * np.arange(samples) / rate)).astype("float32")


def request(text, images=(), clips=()):
    """A `vllm.LLM.generate` prompt with images and 16 kHz clips."""
    data = {}
    if images:
        data["image"] = list(images)
    if clips:
        data["audio"] = [(clip, RATE) for clip in clips]
    return {"prompt": text, "multi_modal_data": data} if data else text


def encoded(clip, fmt, rate=RATE):
    """`clip` encoded as a `"wav"`, `"flac"` or `"mp3"` file, with PyAV.

    Returns:
        The file's bytes.
    """
    import av

    codec = {"wav": "pcm_s16le", "flac": "flac", "mp3": "libmp3lame"}[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(clip[None], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def decoded(data, rate=RATE):
    """What vLLM's server makes of an audio file: its samples at their own
    rate (`AudioMediaIO`), resampled to `rate` by the processor's parser
    (with PyAV, as `KerasHubProcessingInfo.get_data_parser` asks)."""
    from vllm.multimodal.audio import AudioResampler
    from vllm.multimodal.media.audio import load_audio

    from vllm_keras_hub.vllm_fixes.audio_integer_samples import scale_integer_samples

    scale_integer_samples()  # As the server does (`models/multimodal.py`).
    samples, native = load_audio(io.BytesIO(data), sr=None, backend="pyav")
    resampler = AudioResampler(target_sr=rate, method="pyav")
    return resampler.resample(samples, orig_sr=native).astype("float32")


def audio_positions(preset, ids):
    """The positions of the audio soft tokens in `ids`."""
    import keras_hub

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    soft_token = tokenizer.token_to_id(tokenizer.audio_placeholder)
    return [i for i, token in enumerate(ids) if token == soft_token]


def assert_the_second_hits_the_prefix_cache_inside_the_clip(llm, preset, prompts, params):
    """Served one after the other, two prompts with the same clip and text
    before it give the oracle's tokens, and the second's cached blocks end
    inside the clip: its last tokens are computed in the next step."""
    from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
    from vllm_keras_hub.testing.images import assert_tokens

    expected = keras_hub_greedy_with_images(preset, prompts, params.max_tokens)
    first = llm.generate([request(*prompts[0])], params, use_tqdm=False)
    second = llm.generate([request(*prompts[1])], params, use_tqdm=False)
    assert_tokens(first + second, expected)
    positions = audio_positions(preset, expected[1][0])
    assert positions[0] < second[0].num_cached_tokens <= positions[-1]

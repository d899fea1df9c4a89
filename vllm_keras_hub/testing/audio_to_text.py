"""A tiny random-weight `MoonshineAudioToText` preset, and its own greedy tokens.

Saved with `save_to_preset` (backbone, preprocessor with its audio
converter, tokenizer), as KerasHub's published Moonshine presets are laid
out. Its heads are 36 wide, as `moonshine_tiny_en`'s are, which vLLM's CPU
kernel runs padded to 64. Moonshine's small initializer makes a random
decoder repeat one token whatever the clip; its weights are drawn wider,
so that each clip's tokens differ and change along the output.
"""

import io
import os
import wave

import numpy as np

SAMPLING_RATE = 16000
# The decoder length the oracle packs: its prompt and generated tokens.
_DECODER_LENGTH = 64


def build_tiny_moonshine(directory, seed=0, **shape):
    """Saves a 2-layer Moonshine (72 wide, heads of 36) into `directory`;
    `shape`: `MoonshineBackbone` arguments over the tiny ones."""
    import keras
    import keras_hub

    from vllm_keras_hub.testing.tokenizers import tiny_sentencepiece_proto

    tokenizer = keras_hub.models.MoonshineTokenizer(proto=tiny_sentencepiece_proto(layout="llama"))
    keras.utils.set_random_seed(seed)
    tiny = dict(filter_dim=72, encoder_num_layers=2, decoder_num_layers=2, hidden_dim=72,
                intermediate_dim=96, encoder_num_heads=2, decoder_num_heads=2)  # fmt: skip
    backbone = keras_hub.models.MoonshineBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), dtype="float32", **{**tiny, **shape}
    )
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        if variable.path.endswith(("gamma", "beta", "inv_freq")):
            continue
        variable.assign(rng.normal(0, 0.15, variable.shape).astype("float32"))
    # Byte pieces' rows zeroed, so the decoder never picks one: each
    # transcript is whole pieces of text, which every detokenizer spells
    # alike (vLLM's holds back a byte that is not whole UTF-8 yet).
    embeddings = backbone.token_embedding.embeddings
    rows = np.asarray(embeddings.numpy())
    for index in range(tokenizer.vocabulary_size()):
        if tokenizer.id_to_token(index).startswith("<0x"):
            rows[index] = 0
    embeddings.assign(rows)
    preprocessor = keras_hub.models.MoonshineAudioToTextPreprocessor(
        audio_converter=keras_hub.layers.MoonshineAudioConverter(),
        tokenizer=tokenizer,
    )
    task = keras_hub.models.MoonshineAudioToText(backbone=backbone, preprocessor=preprocessor)
    os.makedirs(directory, exist_ok=True)
    task.save_to_preset(directory)
    return directory


def clip(seconds, seed):
    """A clip of noise with a tone, no sample exactly zero."""
    rng = np.random.default_rng(seed)
    count = int(seconds * SAMPLING_RATE)
    tone = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * np.arange(count) / SAMPLING_RATE)
    samples = tone + rng.normal(0, 0.1, count)
    samples[samples == 0] = 1e-4
    return samples.astype("float32")


def wav_bytes(samples):
    """`samples` as a 16-bit mono WAV file; and the samples it holds."""
    pcm = np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLING_RATE)
        f.writeframes(pcm.tobytes())
    return buffer.getvalue(), (pcm / 32768.0).astype("float32")


def keras_hub_greedy(preset, clips, max_new_tokens, texts=None):
    """The preset's own greedy tokens for each clip, after its decoder prompt.

    Each clip runs alone, as the preset's own preprocessing and
    `generate_step` run a batch of one (`generate()`'s own postprocessing
    aside). Its batches pad clips with zeros, which its encoder's group
    norm and its converter's padding mask then see.

    Returns:
        `(prompts, outputs)`: each packed decoder prompt, and the tokens
        generated after it, the end token included where reached.
    """
    import keras_hub
    import torch

    task = keras_hub.models.MoonshineAudioToText.from_preset(preset, dtype="float32")
    task.compile(sampler="greedy")
    preprocessor = task.preprocessor
    end = preprocessor.tokenizer.end_token_id
    texts = texts or [None] * len(clips)
    prompts, outputs = [], []
    for samples, text in zip(clips, texts, strict=True):
        x = {"audio": np.asarray(samples, "float32")[None]}
        if text is not None:
            x["text"] = [text]
        # `generate()` wraps its steps in `no_grad`; without it each step's
        # autograd graph is kept.
        with torch.no_grad():
            inputs = preprocessor.generate_preprocess(x, decoder_sequence_length=_DECODER_LENGTH)
            prompt_length = int(np.asarray(inputs["decoder_padding_mask"]).sum())
            ids = np.asarray(task.generate_step(inputs, stop_token_ids=(end,))["decoder_token_ids"])[0]
        generated = [int(t) for t in ids[prompt_length : prompt_length + max_new_tokens]]
        if end in generated:
            generated = generated[: generated.index(end) + 1]
        prompts.append([int(t) for t in ids[:prompt_length]])
        outputs.append(generated)
    return prompts, outputs

"""Audio clips into a Gemma3n preset: features, and their embeddings.

The two halves of what `Gemma3nCausalLM` does with a clip, with the
preset's own parts:
- in vLLM's front end (`multimodal.py`), the preset's
  `Gemma3nAudioConverter` turns each clip, already decoded and resampled to
  the converter's rate by vLLM, into log-mel features and their mask
  (`to_features`);
- in the model (`vision.py`), the backbone's own embedding processor turns
  one clip's features into the embeddings of its soft tokens
  (`embed_clip`): its audio encoder, its audio embedder, and its padding
  (or cutting) of every clip to `audio_soft_tokens_per_image` embeddings.

Each clip is converted and encoded alone. KerasHub's preprocessor pads a
batch's clips to the longest with zero samples that its mask counts as
audio, so a clip's embeddings there depend on the other clips of its batch;
alone, they are what `generate()` gives a prompt with that clip.
"""

import functools

import torch


@functools.lru_cache(maxsize=4)
def _audio_converter(preset):
    from vllm_keras_hub.backend import default_to_torch

    default_to_torch()
    from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter

    return AudioConverter.from_preset(preset)


def clip_features(converter, clip):
    """The converter's features of one clip, as `Gemma3nCausalLMPreprocessor`
    hands them to the backbone.

    Args:
        converter: The preset's `Gemma3nAudioConverter`.
        clip: A 1-D float array of samples at the converter's rate.

    Returns:
        `(features, mask)`: float32 `(frames, mel bins)` and bool
        `(frames,)`, True at padding frames (the preprocessor inverts the
        converter's mask of valid frames).
    """
    import numpy as np
    from keras import ops

    features, valid = converter(np.asarray(clip, "float32"))
    features = ops.convert_to_numpy(features).astype("float32")
    return features, ~ops.convert_to_numpy(valid).astype(bool)


def to_features(preset, clips):
    """The preset's audio converter on `clips`, as the model's inputs.

    Args:
        preset: The KerasHub preset.
        clips: 1-D float arrays at the converter's rate (vLLM's parsed
            audio items).

    Returns:
        A dict of lists, one tensor per clip (clips differ in length):
        `input_features` and `input_features_mask` (`clip_features`).
    """
    converter = _audio_converter(preset)
    pairs = [clip_features(converter, clip) for clip in clips]
    return {
        "input_features": [torch.from_numpy(features) for features, _ in pairs],
        "input_features_mask": [torch.from_numpy(mask) for _, mask in pairs],
    }


def embed_clip(backbone, features, mask, audio_token_id, tokens_per_clip):
    """One clip's soft-token embeddings, from the backbone's own processor.

    `Gemma3nMultimodalEmbeddingProcessor` encodes the clip, embeds it,
    pads or cuts it to `tokens_per_clip` and puts it at the audio tokens;
    given a row of nothing but audio tokens, its output is the clip's
    embeddings.

    Args:
        backbone: The `Gemma3nBackbone`.
        features: `(frames, mel bins)` features of one clip.
        mask: `(frames,)` bool, True at padding frames.
        audio_token_id: The audio soft token's id.
        tokens_per_clip: The backbone's `audio_soft_tokens_per_image`.

    Returns:
        A `(tokens_per_clip, hidden_size)` tensor.
    """
    device = features.device
    token_ids = torch.full((1, tokens_per_clip), audio_token_id, device=device)
    embeddings, _ = backbone.embedding_processor(
        {
            "token_ids": token_ids,
            "input_features": features[None, None],
            "input_features_mask": mask[None, None],
        }
    )
    return embeddings[0]

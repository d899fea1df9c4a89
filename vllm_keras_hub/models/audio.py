"""Audio clips into a preset: their features, as its preprocessor makes them.

The two halves of what the family's `CausalLM` does with a clip, with the
preset's own parts:
- in vLLM's front end (`multimodal.py`), the preset's audio converter
  turns each clip, already decoded and resampled to the converter's rate by
  vLLM, into log-mel features and their mask (`to_features`);
- in the model (the family's `media.py`, its `_embed_clip`), the
  backbone's own layers turn one clip's features into the embeddings of its
  soft tokens.

Each clip is converted and encoded alone. KerasHub's Gemma3n preprocessor
pads a batch's clips to the longest with zero samples that its mask counts
as audio, and Gemma4's gives every clip of a batch the longest clip's token
count; alone, a clip's embeddings are what `generate()` gives a prompt with
that clip.
"""

import torch


def audio_converter(preset):
    """The preset's audio converter, read once for the served preset."""
    from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter

    from vllm_keras_hub.preset import served

    return served(preset).load(AudioConverter)


def clip_features(preset, converter, clip):
    """The converter's features of one clip, as the family's preprocessor
    hands them to the backbone: the family's own `inputs.clip_features`
    where it has one (`families.part`), else the converter's features and
    its mask of valid frames, inverted.

    Args:
        preset: The preset (a served `Preset`).
        converter: The preset's audio converter.
        clip: A 1-D float array of samples at the converter's rate.

    Returns:
        `(features, mask)`: float32 `(frames, mel bins)` and bool
        `(frames,)`, True at padding frames.
    """
    import numpy as np
    from keras import ops

    clip = np.asarray(clip, "float32")
    inputs = preset.part("inputs")
    if hasattr(inputs, "clip_features"):
        return inputs.clip_features(converter, clip)
    features, valid = converter(clip)
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
    from vllm_keras_hub.preset import served

    converter = audio_converter(preset)
    pairs = [clip_features(served(preset), converter, clip) for clip in clips]
    return {
        "input_features": [torch.from_numpy(features) for features, _ in pairs],
        "input_features_mask": [torch.from_numpy(mask) for _, mask in pairs],
    }

"""The oracle's audio: clips as Gemma3n's and Gemma4's preprocessors take them.

Their `CausalLMPreprocessor`s need TensorFlow for audio, so their steps are
taken here with the preset's own audio converter, read from keras-hub 0.32's
source and written out apart from the serving code (`models/audio.py`,
`export/audio_format.py`), so that a wrong count or mask there shows as
other tokens:
- Gemma3n (`_preprocess_audios`, `generate_preprocess`): the converter
  runs with `padding="longest"` and gives its mask of valid frames, which
  the preprocessor inverts (`tf.equal(mask, 0)`); `<start_of_audio>`
  becomes `\\n\\n<start_of_audio>`, `num_audio_tokens_per_audio` audio soft
  tokens, `<end_of_audio>\\n\\n`. The published preprocessors' count is the
  backbone's `audio_soft_tokens_per_image`, which its embedding processor
  pads or cuts a clip to.
- Gemma4 (`_preprocess_audio`, `generate_preprocess`): the converter pads
  or cuts every clip to its 30 s of frames; the mask counts `samples //
  stride` of them valid (`tf.sequence_mask` up to the converter's frames);
  `<|audio|>` becomes `<|audio>`, `max((valid + 3) // 4, 1)` `<|audio|>`,
  `<audio|>`.
Each clip is converted alone, as serving converts it (the preprocessors pad
a batch's clips to the longest).
"""

import keras
import keras_hub
import numpy as np


def audio_converter(preset):
    """The preset's own audio converter, as its preprocessor loads it."""
    return keras_hub.layers.AudioConverter.from_preset(preset)


def clip_inputs(converter, clip):
    """One clip's features and padding mask, as the family's preprocessor
    hands them to the backbone.

    Args:
        converter: The preset's `Gemma3nAudioConverter` or
            `Gemma4AudioConverter`.
        clip: A 1-D float array of samples at the converter's rate.

    Returns:
        `(features, padding)`: float32 `(frames, mel bins)` and bool
        `(frames,)`, True at padding frames.
    """
    batch = np.asarray(clip, "float32")[None]
    if isinstance(converter, keras_hub.layers.Gemma4AudioConverter):
        features = keras.ops.convert_to_numpy(converter(batch))[0].astype("float32")
        valid = len(clip) // converter.stride
        return features, np.arange(len(features)) >= valid
    features, mask = converter(batch, padding="longest")
    features = keras.ops.convert_to_numpy(features)[0].astype("float32")
    return features, keras.ops.convert_to_numpy(mask)[0] == 0


def soft_tokens(causal_lm, converter, clip):
    """The audio soft tokens the family's preprocessor gives `clip`."""
    if isinstance(converter, keras_hub.layers.Gemma4AudioConverter):
        _, padding = clip_inputs(converter, clip)
        return max((int((~padding).sum()) + 3) // 4, 1)
    return int(causal_lm.backbone.audio_soft_tokens_per_image)


def expand_clips(causal_lm, tokenizer, converter, text, clips):
    """`text` with each clip's placeholder expanded as the preprocessor
    expands it."""
    gemma4 = isinstance(converter, keras_hub.layers.Gemma4AudioConverter)
    if gemma4:
        placeholder, start, end, newlines = "<|audio|>", "<|audio>", "<audio|>", ""
        soft = placeholder
    else:
        placeholder = start = tokenizer.start_of_audio_token
        end, newlines = tokenizer.end_of_audio_token, "\n\n"
        soft = tokenizer.audio_placeholder
    pieces = text.split(placeholder)
    assert len(pieces) == len(clips) + 1, "one placeholder per clip"
    text = pieces[0]
    for clip, piece in zip(clips, pieces[1:]):
        span = start + soft * soft_tokens(causal_lm, converter, clip) + end
        text += newlines + span + newlines + piece
    return text


def audio_inputs(causal_lm, tokenizer, converter, token_ids, clips):
    """The backbone's audio inputs of a batch of one: each clip's features
    alone, so clips of one prompt must be of one length. Gemma3n:
    `input_features` and its mask of padding; Gemma4: `audio_mel`, its mask
    of valid frames, and the soft tokens' places."""
    pairs = [clip_inputs(converter, clip) for clip in clips]
    features = np.stack([f for f, _ in pairs])[None]
    padding = np.stack([m for _, m in pairs])[None]
    if not isinstance(causal_lm.backbone, keras_hub.models.Gemma4Backbone):
        return {"input_features": features, "input_features_mask": padding}
    assert len({len(clip) for clip in clips}) == 1, "generate() takes clips of one length"
    audio_mask = token_ids == tokenizer.token_to_id("<|audio|>")
    return {
        "audio_mel": features,
        "audio_mel_mask": (~padding).astype("int32"),
        "audio_indices": np.nonzero(audio_mask[0])[0][None].astype("int32"),
        "audio_mask": audio_mask.astype("int32"),
    }

"""Audio clips into a Gemma3n or Gemma4 preset: features, and their embeddings.

The two halves of what the family's `CausalLM` does with a clip, with the
preset's own parts:
- in vLLM's front end (`multimodal.py`), the preset's audio converter
  turns each clip, already decoded and resampled to the converter's rate by
  vLLM, into log-mel features and their mask (`to_features`);
- in the model (`vision.py`), the backbone's own layers turn one clip's
  features into the embeddings of its soft tokens. Gemma3n (`embed_clip`):
  its embedding processor, which encodes, embeds and pads (or cuts) every
  clip to `audio_soft_tokens_per_image` embeddings. Gemma4
  (`embed_gemma4_clip`): its audio encoder on the converter's 30 s of
  frames, of which the clip's first embeddings are placed, as many as its
  preprocessor gave it tokens.

Each clip is converted and encoded alone. KerasHub's Gemma3n preprocessor
pads a batch's clips to the longest with zero samples that its mask counts
as audio, and Gemma4's gives every clip of a batch the longest clip's token
count; alone, a clip's embeddings are what `generate()` gives a prompt with
that clip.
"""

import functools

import torch
from vllm.model_executor.models.interfaces import SupportsTranscription
from vllm.model_executor.models.whisper_utils import ISO639_1_SUPPORTED_LANGS


@functools.lru_cache(maxsize=4)
def _audio_converter(preset):
    from vllm_keras_hub.backend import default_to_torch

    default_to_torch()
    from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter

    from vllm_keras_hub.preset import served

    return served(preset).load(AudioConverter)


def clip_features(converter, clip):
    """The converter's features of one clip, as the family's preprocessor
    hands them to the backbone.

    Args:
        converter: The preset's `Gemma3nAudioConverter` or
            `Gemma4AudioConverter`.
        clip: A 1-D float array of samples at the converter's rate.

    Returns:
        `(features, mask)`: float32 `(frames, mel bins)` and bool
        `(frames,)`, True at padding frames. Gemma3n's preprocessor inverts
        its converter's mask of valid frames; Gemma4's converter pads every
        clip to 30 s, and its preprocessor counts `samples // stride` frames
        valid.
    """
    import numpy as np
    from keras import ops
    from keras_hub.src.models.gemma4.gemma4_audio_converter import Gemma4AudioConverter

    clip = np.asarray(clip, "float32")
    if isinstance(converter, Gemma4AudioConverter):
        features = ops.convert_to_numpy(converter(clip)).astype("float32")
        padding = np.arange(len(features)) >= len(clip) // converter.stride
        return features, padding
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


def embed_gemma4_clip(backbone, features, mask):
    """One clip's soft-token embeddings, as `Gemma4Backbone` places them.

    Its audio encoder takes the converter's frames, padding and all; the
    backbone scales its outputs by 1/sqrt(hidden) and puts the first of
    them at the clip's tokens, one per 4 valid frames, rounded up
    (`audio_format.clip_tokens`).

    Args:
        backbone: The `Gemma4Backbone`.
        features: `(frames, mel bins)` features of one clip.
        mask: `(frames,)` bool, True at padding frames.

    Returns:
        A `(tokens, hidden_size)` tensor.
    """
    from vllm_keras_hub.export.audio_format import frame_tokens

    valid = ~mask
    embeddings = backbone.audio_encoder(features[None, None], valid[None, None])[0, 0]
    count = frame_tokens(int(valid.sum()))
    scale = torch.tensor(float(backbone.hidden_dim) ** -0.5, dtype=embeddings.dtype)
    return embeddings[:count] * scale


class Gemma3nTranscription(SupportsTranscription):
    """`/v1/audio/transcriptions` (and translations) for Gemma3n presets.

    Gemma3n transcribes from a free-form prompt. vLLM's own Gemma3n fixes
    it as below; here the clip's placeholder is KerasHub's,
    `<start_of_audio>`, which expands as for any prompt. A clip is cut at
    the converter's 30 s, as KerasHub cuts it, and not split.
    """

    supported_languages = ISO639_1_SUPPORTED_LANGS

    @classmethod
    def get_generation_prompt(cls, stt_params):
        from vllm.inputs import TextPrompt

        language = cls.supported_languages.get(stt_params.language or "", "")
        to_language = cls.supported_languages.get(stt_params.to_language or "", "")
        transcribe = stt_params.task_type == "transcribe"
        prompt = "<start_of_turn>user\n"
        prompt += "Transcribe this audio" if transcribe else "Translate this audio"
        if transcribe and language:
            prompt += f" into {language}"
        elif not transcribe:
            prompt += f" from {language}" if language else ""
            prompt += f" into {to_language}" if to_language else ""
        prompt += ": <start_of_audio><end_of_turn>\n<start_of_turn>model\n"
        rate = stt_params.stt_config.sample_rate
        return TextPrompt(prompt=prompt, multi_modal_data={"audio": (stt_params.audio, rate)})

    @classmethod
    def get_speech_to_text_config(cls, model_config, task_type):
        from vllm.config import SpeechToTextConfig

        from vllm_keras_hub.export.audio_format import read_audio_format

        audio = read_audio_format(model_config.hf_config)
        if audio is None:
            raise ValueError(
                "This Gemma3n preset has no audio encoder or audio converter: "
                "it transcribes nothing."
            )
        rate = audio["sampling_rate"]
        return SpeechToTextConfig(
            sample_rate=rate,
            max_audio_clip_s=audio["max_samples"] // rate,
            min_energy_split_window_size=None,
        )

"""What a preset served with audio needs: its format, in `config.json`.

A preset served with images (`image_format.py`) whose family reads an
audio format (its `formats.audio_fields`) and that also carries an audio
encoder, an audio converter and audio tokens is served with audio too. Its
`config.json` carries the audio format as `keras_hub_audio`, read by the
processor (`models/multimodal.py`, `models/audio.py`) and the model class:
- `placeholder`: what a prompt writes for a clip;
- `start_token`, `audio_token`, `end_token`, `tokens_per_clip`, `newlines`:
  what the placeholder expands to, as the family's `CausalLMPreprocessor`
  expands it: `newlines + start + audio_token * count + end + newlines`;
- `frame_stride`: how `count` is found. `None`: every clip takes
  `tokens_per_clip` (Gemma3n's embedding processor pads or cuts every
  clip's embeddings to as many). Else the samples per mel frame; a clip
  takes one token per 4 frames, rounded up, at most `tokens_per_clip`
  (`clip_tokens`), as Gemma4's preprocessor counts them;
- `sampling_rate`: the converter's rate, which vLLM resamples clips to;
- `max_samples`: the longest clip the converter keeps (KerasHub's
  converters cut longer clips, and so do we), for vLLM's profiling.
"""

from vllm_keras_hub import families

# `Gemma4CausalLMPreprocessor`'s audio token count: the converter's valid
# frames over the encoder's 4x subsampling, rounded up.
FRAMES_PER_TOKEN = 4

FIELDS = (
    "placeholder", "start_token", "audio_token", "end_token", "newlines",
    "tokens_per_clip", "frame_stride", "sampling_rate", "max_samples",
)  # fmt: skip


def frame_tokens(frames):
    """The soft tokens of `frames` valid Gemma4 frames: one per 4, rounded up."""
    return (frames + FRAMES_PER_TOKEN - 1) // FRAMES_PER_TOKEN


def clip_tokens(audio, num_samples):
    """The soft tokens of a clip of `num_samples` samples at the converter's
    rate, as the family's preprocessor counts them.

    Args:
        audio: The preset's `keras_hub_audio` config.
        num_samples: The clip's length.

    Raises:
        ValueError: a Gemma4 clip shorter than one frame, which its
            preprocessor gives no tokens.
    """
    stride = audio["frame_stride"]
    if stride is None:
        return audio["tokens_per_clip"]
    # `Gemma4CausalLMPreprocessor.generate_preprocess`: the mask's valid
    # frames, `length // stride` up to the converter's 30 s of frames.
    frames = min(num_samples, audio["max_samples"]) // stride
    if frames == 0:
        raise ValueError(
            f"An audio clip of {num_samples} samples is shorter than one "
            f"frame of this preset's audio converter ({stride} samples at "
            f"{audio['sampling_rate']} Hz): it has no audio to encode."
        )
    return frame_tokens(frames)


def _converter(preset):
    from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter

    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    if not preset.has("audio_converter.json"):
        return None
    return preset.load(AudioConverter)


def audio_fields(preset, backbone_class, backbone_config, tokenizer, serves_images):
    """The `config.json` fields of a preset served with audio; `{}` if none.

    A preset served with images whose family reads an audio format
    (`formats.audio_fields`, `families.part`), with an audio encoder and an
    audio converter, is served with audio too; the family's reader may
    still find no audio tokens.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        backbone_config: Its backbone config.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (its model
            class, the family's image one, serves both).
    """
    formats = families.part(families.family_for_backbone(backbone_class), "formats")
    if not serves_images or not hasattr(formats, "audio_fields"):
        return {}
    if not (
        backbone_config.get("audio_encoder_config") or backbone_config.get("audio_encoder")
    ):
        return {}
    converter = _converter(preset)
    if converter is None:
        return {}
    return formats.audio_fields(preset, backbone_config, tokenizer, converter)


def read_audio_format(config):
    """The `keras_hub_audio` of a model folder's config, or `None`.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    from vllm_keras_hub.export.hf_config import read_media_format

    return read_media_format(config, "audio", FIELDS)

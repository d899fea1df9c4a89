"""What a preset served with audio needs: its format, in `config.json`.

A Gemma3n preset served with images (`image_format.py`) that also carries
an audio encoder, an audio converter and audio tokens is served with audio
too. Its `config.json` carries the audio format as `keras_hub_audio`, read by
the processor (`models/multimodal.py`) and the model class
(`models/audio.py`):
- `placeholder`: what a prompt writes for a clip (`<start_of_audio>`);
- `start_token`, `audio_token`, `end_token`, `tokens_per_clip`, `newlines`:
  what the placeholder expands to, as `Gemma3nCausalLMPreprocessor`
  expands it: `newlines + start + audio_token * tokens_per_clip + end +
  newlines`. `tokens_per_clip` is the backbone's
  `audio_soft_tokens_per_image`, the count its embedding processor pads or
  cuts every clip's embeddings to;
- `sampling_rate`: the converter's rate, which vLLM resamples clips to;
- `max_samples`: the longest clip the converter keeps (KerasHub's
  converter cuts longer clips, and so do we), for vLLM's profiling.
"""

# `Gemma3nAudioConverter.__call__`'s `max_length`, which its preprocessor
# leaves at the default: 30 s at 16 kHz.
CONVERTER_MAX_SAMPLES = 480000

FIELDS = (
    "placeholder", "start_token", "audio_token", "end_token", "newlines",
    "tokens_per_clip", "sampling_rate", "max_samples",
)  # fmt: skip


def _converter(preset):
    from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter
    from keras_hub.src.utils.preset_utils import check_file_exists

    if not check_file_exists(preset, "audio_converter.json"):
        return None
    return AudioConverter.from_preset(preset)


def audio_fields(preset, backbone_class, backbone_config, tokenizer, serves_images):
    """The `config.json` fields of a preset served with audio; `{}` if none.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        backbone_config: Its backbone config.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (its model
            class, Gemma3n's, serves both).
    """
    if backbone_class != "Gemma3nBackbone" or not serves_images:
        return {}
    if not backbone_config.get("audio_encoder_config"):
        return {}
    converter = _converter(preset)
    if converter is None:
        return {}
    audio = dict(
        placeholder=tokenizer.start_of_audio_token,
        start_token=tokenizer.start_of_audio_token,
        # The embedding processor puts the encoder's embeddings at this token.
        audio_token=tokenizer.id_to_token(backbone_config["audio_token_id"]),
        end_token=tokenizer.end_of_audio_token,
        newlines="\n\n",
        tokens_per_clip=int(backbone_config["audio_soft_tokens_per_image"]),
        sampling_rate=int(converter.sampling_rate),
        max_samples=CONVERTER_MAX_SAMPLES,
    )
    return dict(keras_hub_audio=audio)


def read_audio_format(config):
    """The `keras_hub_audio` of a model folder's config, or `None`.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    audio = getattr(config, "keras_hub_audio", None)
    if audio is None:
        return None
    missing = [field for field in FIELDS if field not in audio]
    if missing:
        raise ValueError(
            f"This model folder's audio format lacks {missing}: it was "
            "exported by an older vllm-keras-hub. Export it again "
            "(`vllm-keras-hub export`)."
        )
    return audio

"""What a preset served with audio needs: its format, in `config.json`.

A Gemma3n or Gemma4 preset served with images (`image_format.py`) that also
carries an audio encoder, an audio converter and audio tokens is served
with audio too. Its `config.json` carries the audio format as
`keras_hub_audio`, read by the processor (`models/multimodal.py`) and the
model class (`models/audio.py`):
- `placeholder`: what a prompt writes for a clip (Gemma3n:
  `<start_of_audio>`; Gemma4: `<|audio|>`);
- `start_token`, `audio_token`, `end_token`, `tokens_per_clip`, `newlines`:
  what the placeholder expands to, as the family's `CausalLMPreprocessor`
  expands it: `newlines + start + audio_token * count + end + newlines`;
- `frame_stride`: how `count` is found. `None` (Gemma3n): every clip takes
  `tokens_per_clip`, the backbone's `audio_soft_tokens_per_image`, which its
  embedding processor pads or cuts every clip's embeddings to. Gemma4:
  the samples per mel frame; a clip takes one token per 4 frames, rounded
  up, at most `tokens_per_clip` (`clip_tokens`);
- `sampling_rate`: the converter's rate, which vLLM resamples clips to;
- `max_samples`: the longest clip the converter keeps (KerasHub's
  converters cut longer clips, and so do we), for vLLM's profiling.
"""

# `Gemma3nAudioConverter.__call__`'s `max_length`, which its preprocessor
# leaves at the default: 30 s at 16 kHz.
CONVERTER_MAX_SAMPLES = 480000

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

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        backbone_config: Its backbone config.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (its model
            class, the family's vision one, serves both).
    """
    if not serves_images or backbone_class not in ("Gemma3nBackbone", "Gemma4Backbone"):
        return {}
    if not (
        backbone_config.get("audio_encoder_config") or backbone_config.get("audio_encoder")
    ):
        return {}
    converter = _converter(preset)
    if converter is None:
        return {}
    if backbone_class == "Gemma4Backbone":
        # Its tokenizer knows the audio pieces whether or not it was built
        # with `has_audio_tokens` (its preprocessor looks them up by name).
        pieces = ("<|audio>", "<|audio|>", "<audio|>")
        if any(tokenizer.id_to_token(tokenizer.token_to_id(piece)) != piece for piece in pieces):
            return {}
        start, token, end = pieces
        audio = dict(
            placeholder=token,
            start_token=start,
            audio_token=token,
            end_token=end,
            newlines="",
            tokens_per_clip=int(backbone_config.get("num_audio_tokens_per_clip") or 750),
            frame_stride=int(converter.stride),
            sampling_rate=int(converter.sampling_rate),
            max_samples=int(converter.num_samples),
        )
        return dict(keras_hub_audio=audio)
    audio = dict(
        placeholder=tokenizer.start_of_audio_token,
        start_token=tokenizer.start_of_audio_token,
        # The embedding processor puts the encoder's embeddings at this token.
        audio_token=tokenizer.id_to_token(backbone_config["audio_token_id"]),
        end_token=tokenizer.end_of_audio_token,
        newlines="\n\n",
        tokens_per_clip=int(backbone_config["audio_soft_tokens_per_image"]),
        frame_stride=None,
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
    from vllm_keras_hub.export.hf_config import read_media_format

    return read_media_format(config, "audio", FIELDS)

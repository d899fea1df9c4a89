"""The model folder of an `AudioToText` preset: what vLLM reads to serve it."""

import json
import os

import keras_hub
from keras_hub.src.models.moonshine.moonshine_backbone import compute_output_lengths

from vllm_keras_hub.export import sampling
from vllm_keras_hub.preset import PresetError
from vllm_keras_hub.tasks.audio_to_text import ARCHITECTURE
from vllm_keras_hub.tasks.audio_to_text import FIELD

# The clip lengths KerasHub's Moonshine converter is made for: it warns
# outside them ("pre-segment your audio"). Served clips outside them are
# refused (`processor.py`), none cut or split.
MIN_SECONDS = 0.1
MAX_SECONDS = 64.0


def audio_to_text_class(family):
    """The KerasHub `AudioToText` class of `family`."""
    return getattr(keras_hub.models, family.audio_to_text)


def encoder_frames(num_samples):
    """The encoder's frames for a clip of `num_samples`: its three valid
    convolutions' output length (`moonshine_backbone.compute_output_lengths`)."""
    return int(compute_output_lengths(num_samples))


def decoder_head_size(backbone_config):
    """The decoder's head size, padded as the backbone pads it."""
    size = backbone_config["hidden_dim"] // backbone_config["decoder_num_heads"]
    multiple = backbone_config.get("pad_head_dim_to_multiple_of")
    if multiple:
        size = (size + multiple - 1) // multiple * multiple
    return size


def config_fields(preset, family, backbone_config, tokenizer, max_model_len=None):
    """The `config.json` fields of a speech-to-text preset.

    The decoder prompt is the start token, as the preprocessor's
    `generate_preprocess` packs a clip without text: vLLM's decoder start.

    Raises:
        PresetError: the preset has no audio converter.
    """
    converter = preset.json("audio_converter.json")
    if converter is None:
        raise PresetError(
            f"Cannot serve '{preset}': a {family.display_name} preset is served "
            "with its own audio converter (`audio_converter.json`), and it has none."
        )
    sampling_rate = int(converter["config"]["sampling_rate"])
    longest = int(backbone_config["max_position_embeddings"])
    if max_model_len is not None:
        if max_model_len > longest:
            raise ValueError(
                f"max_model_len={max_model_len} is over the {longest} positions "
                f"this {family.display_name} preset's decoder has."
            )
        longest = int(max_model_len)
    hidden, heads = backbone_config["hidden_dim"], backbone_config["decoder_num_heads"]
    layers = backbone_config["decoder_num_layers"]
    head_size = decoder_head_size(backbone_config)
    return {
        "architectures": [ARCHITECTURE],
        "is_encoder_decoder": True,
        "decoder_start_token_id": tokenizer.start_token_id,
        "eos_token_id": tokenizer.end_token_id,
        "bos_token_id": tokenizer.start_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "vocab_size": int(backbone_config["vocabulary_size"]),
        "hidden_size": int(hidden),
        "num_hidden_layers": int(layers),
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(heads),
        "head_dim": head_size,
        "max_position_embeddings": longest,
        FIELD: {
            "num_layers": int(layers),
            "num_heads": int(heads),
            "head_size": head_size,
            "hidden_dim": int(hidden),
            "start_token_id": tokenizer.start_token_id,
            "sampling_rate": sampling_rate,
            "min_samples": int(MIN_SECONDS * sampling_rate),
            "max_samples": int(MAX_SECONDS * sampling_rate),
            "max_encoder_tokens": encoder_frames(int(MAX_SECONDS * sampling_rate)),
        },
    }


def write_generation_config(family, tokenizer, fields, directory):
    """Stops on the end token; samples with the preset's own default sampler."""
    sampler = sampling.default_sampler(audio_to_text_class(family))
    generation = {
        "eos_token_id": [tokenizer.end_token_id],
        "decoder_start_token_id": fields["decoder_start_token_id"],
        **sampling.generation_config_fields(sampler),
    }
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)

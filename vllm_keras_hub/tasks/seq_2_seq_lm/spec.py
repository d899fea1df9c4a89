"""The model folder of a `Seq2SeqLM` preset: what vLLM reads to serve it."""

import json
import os

import keras_hub

from vllm_keras_hub.export import sampling
from vllm_keras_hub.export.backbone_fields import model_dims
from vllm_keras_hub.tasks.seq_2_seq_lm import ARCHITECTURE
from vllm_keras_hub.tasks.seq_2_seq_lm import FIELD


def seq2seq_lm_class(family):
    """The KerasHub `Seq2SeqLM` class of `family`."""
    return getattr(keras_hub.models, family.seq2seq)


def config_fields(family, backbone_config, tokenizer, max_model_len=None):
    """The `config.json` fields of an encoder-decoder preset.

    vLLM starts each decoder prompt with `decoder_start_token_id` where it
    is not there already; BART's preprocessor starts it with the end token
    then the start token, which the exported tokenizer adds.
    """
    dims = model_dims(backbone_config)
    longest = dims["max_position_embeddings"]
    if max_model_len is not None:
        if max_model_len > longest:
            raise ValueError(
                f"max_model_len={max_model_len} is over the {longest} positions "
                f"this {family.display_name} preset's decoder has."
            )
        dims["max_position_embeddings"] = int(max_model_len)
    return {
        "architectures": [ARCHITECTURE],
        "is_encoder_decoder": True,
        "decoder_start_token_id": tokenizer.end_token_id,
        "eos_token_id": tokenizer.end_token_id,
        "bos_token_id": tokenizer.start_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **dims,
        FIELD: {
            "num_layers": dims["num_hidden_layers"],
            "num_heads": dims["num_attention_heads"],
            "head_size": dims["head_dim"],
            "hidden_dim": dims["hidden_size"],
            # The encoder's learned positions bound its text.
            "max_encoder_tokens": longest,
            "start_token_id": tokenizer.start_token_id,
            "end_token_id": tokenizer.end_token_id,
        },
    }


def write_generation_config(family, tokenizer, directory):
    """Stops on the end token; samples with the preset's own default sampler."""
    sampler = sampling.default_sampler(seq2seq_lm_class(family))
    fields = {
        "eos_token_id": [tokenizer.end_token_id],
        "decoder_start_token_id": tokenizer.end_token_id,
        **sampling.generation_config_fields(sampler),
    }
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(fields, f, indent=2)

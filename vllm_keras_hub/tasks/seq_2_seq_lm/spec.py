"""The model folder of a `Seq2SeqLM` preset: what vLLM reads to serve it.

Each family's `seq2seq` part (`families/<family>/seq2seq.py`) says its
dims and how its preprocessor packs prompts (`fields.py`).
"""

import json
import os

import keras_hub

from vllm_keras_hub import families
from vllm_keras_hub.export import sampling
from vllm_keras_hub.tasks.seq_2_seq_lm import ARCHITECTURE
from vllm_keras_hub.tasks.seq_2_seq_lm import FIELD


def seq2seq_lm_class(family):
    """The KerasHub `Seq2SeqLM` class of `family`."""
    return getattr(keras_hub.models, family.seq2seq)


def config_fields(preset, family, backbone_config, tokenizer, max_model_len=None):
    """The `config.json` fields of an encoder-decoder preset."""
    dims, fields = families.part(family, "seq2seq").config_fields(
        preset, backbone_config, tokenizer
    )
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
        # vLLM starts each decoder prompt with it where it is not there already.
        "decoder_start_token_id": fields["decoder_start_token_id"],
        "eos_token_id": tokenizer.end_token_id,
        "bos_token_id": tokenizer.start_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **dims,
        FIELD: fields,
    }


def write_generation_config(family, tokenizer, fields, directory):
    """Stops on the end token; samples with the preset's own default sampler."""
    sampler = sampling.default_sampler(seq2seq_lm_class(family))
    generation = {
        "eos_token_id": [tokenizer.end_token_id],
        "decoder_start_token_id": fields[FIELD]["decoder_start_token_id"],
        **sampling.generation_config_fields(sampler),
    }
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)

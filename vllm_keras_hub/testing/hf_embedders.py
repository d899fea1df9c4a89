"""The same random embedder weights as a sentence-transformers folder and a preset.

A random transformers model is saved with the sentence-transformers files
vLLM's native embedders read (`modules.json`, pooling, dense projections);
keras-hub's own converter loads that folder into a KerasHub backbone, which
is saved as a `TextEmbedder` preset. vLLM native serves the folder, and
vllm-keras-hub the preset. The folder gets the preset's exported tokenizer,
so both tokenize alike; BERT's gets transformers' own, as all-MiniLM's:
lowercasing and accent stripping, and `max_seq_length` below its position
table (`sentence_bert_config.json`).
"""

import json
import os
import shutil

import numpy as np

from vllm_keras_hub.testing.tokenizers import make_tokenizer

_TINY = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)
# The BERT checkpoint's `max_seq_length`, below its 512 positions (as
# all-MiniLM-L6-v2's 256).
BERT_MAX_SEQ_LENGTH = 32
# keras-hub's Gemma3 converter builds EmbeddingGemma's first projection
# 3072 wide, whatever the checkpoint (`convert_gemma3.py`).
_EMBEDDING_GEMMA_POOLING_DIM = 3072


def _write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def _sentence_transformers_files(folder, hidden_size, pooling_mode, dense=()):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append(
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    )
    _write_json(
        os.path.join(folder, "1_Pooling", "config.json"),
        {"word_embedding_dimension": hidden_size, pooling_mode: True},
    )
    for index, (name, weight) in enumerate(dense, start=2):
        from safetensors.numpy import save_file

        modules.append(
            {"idx": index, "name": str(index), "path": name, "type": "sentence_transformers.models.Dense"}
        )
        out_features, in_features = weight.shape
        _write_json(
            os.path.join(folder, name, "config.json"),
            {
                "in_features": in_features,
                "out_features": out_features,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
            },
        )
        save_file({"linear.weight": weight}, os.path.join(folder, name, "model.safetensors"))
    modules.append(
        {"idx": len(modules), "name": str(len(modules)), "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}
    )  # fmt: skip
    _write_json(os.path.join(folder, "modules.json"), modules)


def _save_qwen3(folder, vocabulary_size, **shape):
    import transformers

    config = transformers.Qwen3Config(**{**_TINY, "vocab_size": vocabulary_size, **shape})
    _save(transformers.AutoModelForCausalLM, config, folder)
    _sentence_transformers_files(folder, config.hidden_size, "pooling_mode_lasttoken")


def _save_embedding_gemma(folder, vocabulary_size, **shape):
    import transformers

    shape = {**_TINY, "vocab_size": vocabulary_size, "sliding_window": 64, **shape}
    config = transformers.Gemma3TextConfig(
        **shape,
        use_bidirectional_attention=True,
        # As in Gemma3's checkpoints: keras-hub's converter scales queries by
        # head_dim only when this equals it.
        query_pre_attn_scalar=shape["head_dim"],
        architectures=["Gemma3TextModel"],
    )
    _save(transformers.AutoModel, config, folder)
    rng = np.random.default_rng(0)
    width, hidden = _EMBEDDING_GEMMA_POOLING_DIM, config.hidden_size
    dense = (
        ("2_Dense", rng.normal(0, 0.05, (width, hidden)).astype("float32")),
        ("3_Dense", rng.normal(0, 0.05, (hidden, width)).astype("float32")),
    )
    _sentence_transformers_files(folder, config.hidden_size, "pooling_mode_mean_tokens", dense)


def _save_bert(folder, vocabulary_size, **shape):
    import transformers

    config = transformers.BertConfig(
        **{
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            # As BERT's: more than the 256 tokens its preprocessor packs.
            "max_position_embeddings": 512,
            "vocab_size": vocabulary_size,
            # KerasHub's BERT layers use the tanh approximation.
            "hidden_act": "gelu_pytorch_tanh",
            **shape,
        }
    )
    _save(transformers.AutoModel, config, folder)
    _sentence_transformers_files(folder, config.hidden_size, "pooling_mode_mean_tokens")


def _save(auto_class, config, folder):
    import torch

    torch.manual_seed(0)
    auto_class.from_config(config, dtype=torch.float32).save_pretrained(folder)


PAIRS = {
    "qwen3": ("Qwen3TextEmbedder", "qwen3", _save_qwen3),
    "embedding_gemma": ("Gemma3TextEmbedder", "gemma3", _save_embedding_gemma),
    "bert": ("BertTextEmbedder", "bert", _save_bert),
}


def _tokenizer(family):
    import keras_hub

    from vllm_keras_hub.testing.embedders import encoder_tokenizer
    from vllm_keras_hub.testing.embedders import BERT_EXTRA_PIECES

    if family != "bert":
        return make_tokenizer(family)
    tokens = list(encoder_tokenizer(family).get_vocabulary()) + list(BERT_EXTRA_PIECES)
    return keras_hub.tokenizers.BertTokenizer(vocabulary=tokens)


def save_pair(name, directory, **shape):
    """Saves embedder `name`'s folder and preset under `directory`.

    Args:
        name: A key of `PAIRS`.
        directory: Where to save them.
        **shape: transformers config values over the tiny ones (e.g. a
            published model's sizes, for benchmarks).

    Returns:
        `(sentence_transformers_folder, preset_folder)`.
    """
    import keras_hub

    from vllm_keras_hub.export.preset_folder import write_model_folder

    embedder_name, family, save = PAIRS[name]
    hf_folder = os.path.join(directory, "hf")
    preset = os.path.join(directory, "preset")
    tokenizer = _tokenizer(family)
    save(hf_folder, tokenizer.vocabulary_size(), **shape)
    embedder_cls = getattr(keras_hub.models, embedder_name)
    backbone = keras_hub.models.Backbone.from_preset(hf_folder)
    preprocessor = embedder_cls.preprocessor_cls(tokenizer=tokenizer)
    embedder_cls(backbone=backbone, preprocessor=preprocessor).save_to_preset(preset)
    if family == "bert":
        # WordPiece does not export: transformers' own BERT tokenizer of the
        # same vocabulary, lowercasing (and so stripping accents) as
        # all-MiniLM's does. On lowercase ASCII text it gives the preset's ids.
        import transformers

        tokens = tokenizer.get_vocabulary()
        transformers.BertTokenizer(
            vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True
        ).save_pretrained(hf_folder)
        # As BERT checkpoints ship it; keras-hub's converter reads it.
        with open(os.path.join(hf_folder, "vocab.txt"), "w") as f:
            f.write("\n".join(tokens) + "\n")
        _write_json(
            os.path.join(hf_folder, "sentence_bert_config.json"),
            {"max_seq_length": BERT_MAX_SEQ_LENGTH, "do_lower_case": False},
        )
        return hf_folder, preset
    exported = os.path.join(directory, "exported")
    write_model_folder(preset, exported)
    for name in os.listdir(exported):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(exported, name), hf_folder)
    return hf_folder, preset


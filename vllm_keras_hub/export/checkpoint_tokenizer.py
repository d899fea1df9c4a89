"""A Hugging Face checkpoint's own tokenizer, served in place of keras-hub's.

keras-hub's converters rebuild a KerasHub tokenizer from part of a
checkpoint's tokenizer files, and lose the rest:
- BERT's reads `vocab.txt` and `do_lower_case` only. Where the checkpoint's
  normalizer strips accents (`strip_accents` unset, lowercasing on: every
  uncased BERT), keras-hub keeps them: "café crème" becomes `[UNK] [UNK]`,
  not `cafe cr ##eme`; its lowercasing also folds `²` to `2`.
- The byte-level BPE converters (Llama 3, Qwen, Qwen3, SmolLM3, GPT-OSS,
  GPT-2) build a tokenizer whose split pattern `tokenizers` matches as a
  plain string (see `export/tokenizer.py`), so text is never pre-split:
  runs of whitespace, and with a full vocabulary words, merge otherwise.
- Special tokens are keras-hub's packing, not the checkpoint's: a
  Qwen3-Embedding preprocessor appends `<|im_end|>`, where Qwen's own
  pipeline appends `<|endoftext|>`.
- A Llama 2 layout (`model_type` `llama`, SentencePiece) is converted as
  Llama 3's byte-level BPE.
- `sentence_bert_config.json`'s `max_seq_length` only sets how far the
  preprocessor truncates.

So a preset loaded through a converter (`hf://...`, or a local checkpoint
folder) that ships `tokenizer.json` is served with that file, through
`tokenizers`, as vLLM serves the checkpoint natively: every text gets the
checkpoint's own ids, special tokens included. keras-hub's tokenizer must
still hold the same token at every id both have (the model folder names
the start, end and stop tokens by keras-hub's ids); a checkpoint where it
does not is refused. The embedder folder carries the checkpoint's
sentence-transformers config, so vLLM takes `max_seq_length` (and
`do_lower_case`) from it as it does for the checkpoint itself.
"""

import json
import os
import shutil

from vllm_keras_hub.export import tokenizer as tokenizer_export
from vllm_keras_hub.export.tokenizer_backends import TokenizerExportError

TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# The sentence-transformers configs vLLM looks for, in its order
# (`get_sentence_transformer_tokenizer_config`): it reads the first that
# exists, and uses it only if it has a `max_seq_length`.
SENTENCE_TRANSFORMERS_CONFIGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
SENTENCE_TRANSFORMERS_CONFIG_FILE = SENTENCE_TRANSFORMERS_CONFIGS[0]


class CheckpointTokenizerError(ValueError):
    """A checkpoint whose own tokenizer cannot be served, naming why."""


def is_checkpoint(preset):
    """Whether `preset` is a Hugging Face checkpoint, read by a converter."""
    from vllm_keras_hub.preset import Preset

    return Preset.of(preset).converter is not None


def read_checkpoint_tokenizer(preset, tokenizer, vocabulary_size):
    """The checkpoint's own `tokenizers.Tokenizer`, checked against keras-hub's.

    Args:
        preset: A preset reference.
        tokenizer: The KerasHub tokenizer keras-hub's converter built.
        vocabulary_size: The backbone's vocabulary size.

    Returns:
        The tokenizer of the checkpoint's `tokenizer.json`, or `None` for a
        KerasHub preset, or a checkpoint without one whose converter runs
        its SentencePiece model (`tokenizer.model`).

    Raises:
        CheckpointTokenizerError: keras-hub's tokenizer holds another token
            than the checkpoint's at some id, an id is past the model's
            vocabulary, a special token keras-hub names is not special in
            it, or a WordPiece or byte-level BPE checkpoint has no
            `tokenizer.json`.
    """
    from keras_hub.tokenizers import BytePairTokenizer
    from keras_hub.tokenizers import WordPieceTokenizer
    from tokenizers import Tokenizer

    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    if not is_checkpoint(preset):
        return None
    if not preset.has(TOKENIZER_FILE):
        if isinstance(tokenizer, WordPieceTokenizer):
            raise CheckpointTokenizerError(
                f"it has no {TOKENIZER_FILE}, and keras-hub's converter builds "
                "its WordPiece tokenizer from vocab.txt and do_lower_case "
                "alone, which loses the checkpoint's accent stripping."
            )
        if isinstance(tokenizer, BytePairTokenizer):
            raise CheckpointTokenizerError(
                f"it has no {TOKENIZER_FILE}, and the byte-level BPE tokenizer "
                "keras-hub's converter builds never splits text before merging "
                "(see export/tokenizer.py), as the checkpoint's does."
            )
        return None
    backend = Tokenizer.from_file(preset.path(TOKENIZER_FILE))
    ids = backend.get_vocab(with_added_tokens=True).values()
    if max(ids) >= vocabulary_size:
        raise CheckpointTokenizerError(
            f"its {TOKENIZER_FILE} has id {max(ids)}, past the model's "
            f"{vocabulary_size} embeddings."
        )
    for index, token in enumerate(tokens_by_id(tokenizer)):
        own = backend.id_to_token(index)
        # Ids only keras-hub has (a token its converter adds) name nothing
        # the checkpoint's tokenizer can produce.
        if token is not None and own is not None and own != token:
            raise CheckpointTokenizerError(
                f"keras-hub's converter reads token id {index} as {token!r}, "
                f"its {TOKENIZER_FILE} as {own!r}."
            )
    try:
        tokenizer_export.special_tokens(tokenizer, backend)
    except TokenizerExportError as e:
        raise CheckpointTokenizerError(f"in its {TOKENIZER_FILE}, {e}") from e
    return backend


def tokens_by_id(tokenizer):
    """The tokens of a KerasHub tokenizer in id order (`None` for an unused id).

    A byte-pair tokenizer's `get_vocabulary()` is its vocabulary dict's
    keys, in the dict's order, not by id (and a `dict_keys`, which Python
    compares as a set).
    """
    from keras_hub.tokenizers import BytePairTokenizer

    if isinstance(tokenizer, BytePairTokenizer):
        table = [None] * (max(tokenizer.vocabulary.values()) + 1)
        for token, index in tokenizer.vocabulary.items():
            table[index] = token
        return table
    return list(tokenizer.get_vocabulary())


def write_checkpoint_tokenizer(preset, backend, tokenizer, directory):
    """Writes the checkpoint's `tokenizer.json` as is, and its config.

    `tokenizer_config.json` names the start, end, pad and unknown tokens as
    keras-hub's tokenizer does (by its ids, which `read_checkpoint_tokenizer`
    checked), and no `add_bos_token`/`add_eos_token`, so transformers keeps
    the checkpoint's post-processor: vLLM adds the special tokens the
    checkpoint adds.

    Args:
        preset: The checkpoint.
        backend: What `read_checkpoint_tokenizer` returned.
        tokenizer: keras-hub's tokenizer of it.
        directory: The model folder.
    """
    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    special = tokenizer_export.special_tokens(tokenizer, backend)
    own_config = preset.json(HF_TOKENIZER_CONFIG_FILE) or {}
    config = {
        "tokenizer_class": tokenizer_export.TOKENIZER_CLASS,
        **special,
        "extra_special_tokens": tokenizer_export.extra_special_tokens(
            tokenizer, backend, special
        ),
        "split_special_tokens": False,
        # Decoding as the checkpoint's own tokenizer decodes.
        "clean_up_tokenization_spaces": bool(
            own_config.get("clean_up_tokenization_spaces", False)
        ),
    }
    shutil.copy(preset.path(TOKENIZER_FILE), os.path.join(directory, TOKENIZER_FILE))
    tokenizer_export.write_json(os.path.join(directory, HF_TOKENIZER_CONFIG_FILE), config)
    tokenizer_export.write_json(
        os.path.join(directory, tokenizer_export.SPECIAL_TOKENS_MAP_FILE), special
    )


def sentence_transformers_config(preset):
    """The checkpoint's sentence-transformers tokenization config, or `None`.

    As vLLM reads it for a checkpoint it serves natively: the first of
    `SENTENCE_TRANSFORMERS_CONFIGS` there is, if it has a `max_seq_length`
    (the longest text vLLM then serves; `do_lower_case` lowercases texts).
    """
    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    if not is_checkpoint(preset):
        return None
    for name in SENTENCE_TRANSFORMERS_CONFIGS:
        config = preset.json(name)
        if config:
            return config if "max_seq_length" in config else None
    return None


def write_sentence_transformers_config(config, max_seq_length, directory):
    """Writes `config` with `max_seq_length` where vLLM reads it."""
    path = os.path.join(directory, SENTENCE_TRANSFORMERS_CONFIG_FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**config, "max_seq_length": int(max_seq_length)}, f, indent=2)

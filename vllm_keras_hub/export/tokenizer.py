"""Exports a KerasHub tokenizer to Hugging Face `tokenizers` format, exactly.

The oracle is the KerasHub tokenizer itself, quirks included, not the upstream
tokenizer its preset was converted from:

- Byte-level BPE (`BytePairTokenizer` subclasses). Without TensorFlow,
  KerasHub tokenizes with a `tokenizers.Tokenizer` it builds itself, so that
  pipeline is serialized as is. Notably it hands Llama-3's split regex to
  `pre_tokenizers.Split` as a plain string, which `tokenizers` matches
  literally: text is never pre-split, so merges run across word and
  whitespace boundaries. The export keeps that.
- SentencePiece (`SentencePieceTokenizer` subclasses). KerasHub runs the
  `sentencepiece` library on `tokenizer.proto`; the export rebuilds its BPE
  encoder in `tokenizers`: the same normalization (dummy prefix, spaces to
  `▁`), user-defined pieces matched whole, merges ranked by piece score, byte
  fallback, and a decoder that hides control pieces and strips the dummy
  prefix as `sentencepiece` does. One deliberate difference: control
  pieces (`<bos>`, `<eos>`, ...) written in the text itself are read as
  those tokens, as Hugging Face tokenizers read them and as chat templates
  need (`sentencepiece` spells them out byte by byte).

Both backends are built in `tokenizer_backends.py`. Every export is checked
against KerasHub on probe texts before it is written; a tokenizer that cannot
be exported exactly raises `TokenizerExportError`.
"""

import json
import os

from keras_hub.tokenizers import BytePairTokenizer
from keras_hub.tokenizers import SentencePieceTokenizer
from tokenizers import processors

from vllm_keras_hub.export.tokenizer_backends import _SPACE
from vllm_keras_hub.export.tokenizer_backends import TokenizerExportError
from vllm_keras_hub.export.tokenizer_backends import _byte_pair_backend
from vllm_keras_hub.export.tokenizer_backends import _sentencepiece_backend

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"

# The generic fast tokenizer: it loads `tokenizer.json` as is. Model-specific
# classes rebuild their own pre-tokenizer and would drop KerasHub's quirks.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"

# Methods whose KerasHub implementation the export reproduces; a subclass that
# overrides one tokenizes differently.
_BPE_METHODS = (
    "tokenize",
    "detokenize",
    "call",
    "_tokenize_tokenizers",
    "_detokenize_tokenizers",
)
_SENTENCEPIECE_METHODS = (
    "tokenize",
    "detokenize",
    "call",
    "_tokenize_spm",
    "_detokenize_spm",
    "set_proto",
    "_set_proto_spm",
)

# Texts every export is checked on, besides ones drawn from its vocabulary.
_PROBES = (
    "",
    " ",
    "   ",
    "\n\n",
    "Hello, world!",
    " The quick brown fox jumps over the lazy dog. ",
    "multiple    spaces\tand\ttabs\nand\r\nnewlines\n",
    "don't I'll we've they're DON'T",
    "1234567890 3.14159 1,000,000",
    "Café naïve Ångström ça va",
    "😀🎉👍🏽 日本語 中文 한국어 Русский مرحبا",
    "\u00a0\u2009\u202f\u3000\u200b\u00ad",
    "▁ Ġ Ċ ĉ <0x41> <unk> <s> </s> <bos> <eos> <pad>",
    "<|endoftext|> <|begin_of_text|> <|eot_id|> <|im_start|> <|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x  # ok\n",
)
_VOCABULARY_PROBES = 2048
_PIECES_PER_PROBE = 16


def export_tokenizer(tokenizer, directory, add_start_token, add_end_token=False):
    """Writes `tokenizer` in Hugging Face format into `directory`.

    `transformers.AutoTokenizer.from_pretrained(directory)` (and so vLLM)
    then encodes every text to the ids `tokenizer(text)` gives, with the
    start token prepended by the post-processor iff `add_start_token` and the
    tokenizer has one (`encode(text, add_special_tokens=False)` never adds
    it), and decodes ids with `skip_special_tokens=False` to the text
    `tokenizer.detokenize(ids)` gives. The start, end and unknown tokens,
    and the pad token where KerasHub pads with a special token, are named in
    `tokenizer_config.json` and marked special, so `skip_special_tokens=True`
    drops them.

    Args:
        tokenizer: A `keras_hub.tokenizers.Tokenizer`, e.g. from
            `Tokenizer.from_preset`.
        directory: The folder `tokenizer.json`, `tokenizer_config.json`
            and `special_tokens_map.json` are written into; made if missing.
        add_start_token: Whether encoding prepends the start token, as the
            preset's preprocessor does.
        add_end_token: Whether encoding appends the end token, as a text
            embedder's preprocessor does.

    Raises:
        TokenizerExportError: the tokenizer cannot be exported exactly; the
            message names its class and the reason.
    """
    name = type(tokenizer).__name__
    if "int" not in str(getattr(tokenizer, "compute_dtype", "int")):
        raise TokenizerExportError(
            f"{name}: it outputs {tokenizer.compute_dtype} tokens, not ids."
        )
    if getattr(tokenizer, "sequence_length", None):
        raise TokenizerExportError(
            f"{name}: it pads or truncates every output to sequence_length="
            f"{tokenizer.sequence_length}; export a tokenizer without it."
        )
    if isinstance(tokenizer, BytePairTokenizer):
        _check_methods(tokenizer, BytePairTokenizer, _BPE_METHODS)
        backend = _byte_pair_backend(tokenizer)
        keras_hub_splits_specials = False
    elif isinstance(tokenizer, SentencePieceTokenizer):
        _check_methods(
            tokenizer, SentencePieceTokenizer, _SENTENCEPIECE_METHODS
        )
        backend = _sentencepiece_backend(tokenizer)
        keras_hub_splits_specials = True
    else:
        raise TokenizerExportError(
            f"{name}: only byte-level BPE (keras_hub.tokenizers."
            "BytePairTokenizer) and SentencePiece (keras_hub.tokenizers."
            "SentencePieceTokenizer) tokenizers can be exported."
        )
    special = special_tokens(tokenizer, backend)
    start_token = special.get("bos_token") if add_start_token else None
    end_token = special.get("eos_token") if add_end_token else None
    backend.post_processor = _special_tokens_processor(backend, start_token, end_token)
    backend.encode_special_tokens = keras_hub_splits_specials
    _check_against_keras_hub(tokenizer, backend, special)
    # The one deliberate difference: `sentencepiece` never matches control
    # pieces (`<bos>`, `</s>`, ...) written in text, Hugging Face tokenizers
    # do, and chat templates rely on it: vLLM renders `{{ bos_token }}` into
    # the prompt text and tokenizes that without adding special tokens.
    split_special_tokens = False

    config = {
        "tokenizer_class": TOKENIZER_CLASS,
        **special,
        "extra_special_tokens": extra_special_tokens(
            tokenizer, backend, special
        ),
        "add_bos_token": start_token is not None,
        "add_eos_token": end_token is not None,
        "split_special_tokens": split_special_tokens,
        "clean_up_tokenization_spaces": False,
    }
    os.makedirs(directory, exist_ok=True)
    backend.save(os.path.join(directory, TOKENIZER_FILE))
    write_json(os.path.join(directory, TOKENIZER_CONFIG_FILE), config)
    write_json(os.path.join(directory, SPECIAL_TOKENS_MAP_FILE), special)


def write_json(path, value):
    """Writes `value` as indented UTF-8 JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _check_methods(tokenizer, base, methods):
    cls = type(tokenizer)
    overridden = [m for m in methods if getattr(cls, m) is not getattr(base, m)]
    if overridden:
        raise TokenizerExportError(
            f"{cls.__name__}: it overrides {', '.join(overridden)} of "
            f"{base.__name__}, so it does not tokenize as the export does."
        )


def _is_special(backend, token):
    return any(
        added.content == token and added.special
        for added in backend.get_added_tokens_decoder().values()
    )


def special_tokens(tokenizer, backend):
    """The named special tokens, each special in `backend`."""
    name = type(tokenizer).__name__
    ids = {
        "bos_token": getattr(tokenizer, "start_token_id", None),
        "eos_token": getattr(tokenizer, "end_token_id", None),
        "pad_token": getattr(tokenizer, "pad_token_id", None),
    }
    unknown = getattr(backend.model, "unk_token", None)
    if unknown is not None:
        ids["unk_token"] = backend.token_to_id(unknown)
    special = {}
    for key, token_id in ids.items():
        if token_id is None:
            continue
        token = backend.id_to_token(int(token_id))
        if token is None:
            raise TokenizerExportError(
                f"{name}: its {key} id {token_id} is not in the vocabulary."
            )
        if not _is_special(backend, token):
            if key == "pad_token":
                # KerasHub pads with id 0 in families without a pad token
                # (e.g. "!" in GPT-2); marking it special would change text.
                continue
            raise TokenizerExportError(
                f"{name}: its {key} {token!r} is matched in text like plain "
                "text, so it cannot be a special token."
            )
        special[key] = token
    return special


def extra_special_tokens(tokenizer, backend, special):
    """KerasHub's other special tokens that are special in `backend`."""
    named = set(special.values())
    return sorted(
        token
        for token in set(tokenizer.special_tokens)
        if token not in named and _is_special(backend, token)
    )


def _special_tokens_processor(backend, start_token, end_token):
    """Adds `start_token` before and `end_token` after each text, if not None."""
    start = [] if start_token is None else [start_token]
    end = [] if end_token is None else [end_token]
    tokens = dict.fromkeys(start + end)
    return processors.TemplateProcessing(
        single=[*start, "$A", *end],
        pair=[*start, "$A", *end, *(f"{t}:1" for t in start), "$B:1", *(f"{t}:1" for t in end)],
        special_tokens=[(token, backend.token_to_id(token)) for token in tokens],
    )


def _probes(tokenizer):
    probes = list(_PROBES)
    if isinstance(tokenizer, SentencePieceTokenizer):
        vocabulary = tokenizer.get_vocabulary()
        step = max(1, len(vocabulary) // _VOCABULARY_PROBES)
        surfaces = [p.replace(_SPACE, " ") for p in vocabulary[::step]]
        for i in range(0, len(surfaces), _PIECES_PER_PROBE):
            probes.append("".join(surfaces[i : i + _PIECES_PER_PROBE]))
    return probes


def _check_against_keras_hub(tokenizer, backend, special):
    """Raises unless `backend` encodes and decodes the probes as KerasHub."""
    name = type(tokenizer).__name__
    probes = _probes(tokenizer)
    expected = [[int(i) for i in ids] for ids in tokenizer.tokenize(probes)]
    encodings = backend.encode_batch(probes, add_special_tokens=False)
    for text, want, got in zip(probes, expected, encodings):
        if got.ids != want:
            raise TokenizerExportError(
                f"{name}: the export encodes {text!r} to {got.ids}, "
                f"KerasHub to {want}."
            )
    extra = [
        backend.token_to_id(special[key])
        for key in ("bos_token", "eos_token")
        if key in special
    ]
    sequences = expected + [extra + ids + extra for ids in expected]
    want_texts = tokenizer.detokenize(sequences)
    got_texts = backend.decode_batch(sequences, skip_special_tokens=False)
    for ids, want, got in zip(sequences, want_texts, got_texts):
        if got != want:
            raise TokenizerExportError(
                f"{name}: the export decodes {ids} to {got!r}, KerasHub to "
                f"{want!r}."
            )

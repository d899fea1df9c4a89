"""The `tokenizers.Tokenizer` a KerasHub tokenizer is exported as.

A byte-level BPE tokenizer's (`BytePairTokenizer`) is a copy of the one
KerasHub encodes with itself. A SentencePiece tokenizer's
(`SentencePieceTokenizer`) is its `tokenizer.proto` BPE model rebuilt: the
same normalization, user-defined pieces matched whole, merges ranked by piece
score, byte fallback, and a decoder that hides control pieces and strips the
dummy prefix as `sentencepiece` does. A tokenizer neither can reproduce
exactly raises `TokenizerExportError`; `tokenizer.py` checks every backend
against KerasHub before it is written.
"""

import re

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken
from tokenizers import Regex
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers

# sentencepiece_model.proto `SentencePiece.Type` and `TrainerSpec.ModelType`.
_NORMAL = 1
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4
_UNUSED = 5
_BYTE = 6
_BPE_MODEL = 2
_MODEL_TYPES = {1: "Unigram", 2: "BPE", 3: "word", 4: "char"}
_SPACE = "\u2581"


class TokenizerExportError(ValueError):
    """A tokenizer that cannot be exported exactly, naming class and cause."""


def _byte_pair_backend(tokenizer):
    """A copy of the `tokenizers.Tokenizer` KerasHub encodes with."""
    name = type(tokenizer).__name__
    if tokenizer.vocabulary is None:
        raise TokenizerExportError(f"{name}: it has no vocabulary.")
    if not getattr(tokenizer, "_allow_python_workflow", True):
        raise TokenizerExportError(
            f"{name}: it runs on the TensorFlow path "
            "(_allow_python_workflow=False), whose GPT-2 split regex and "
            "placeholder tricks `tokenizers` cannot reproduce."
        )
    tokenizer._maybe_initialized_tokenizers()
    internal = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(internal, Tokenizer):
        raise TokenizerExportError(
            f"{name}: it holds no `tokenizers.Tokenizer` to export."
        )
    backend = Tokenizer.from_str(internal.to_str())
    if backend.post_processor is not None:
        raise TokenizerExportError(
            f"{name}: its backend already has a post-processor, which the "
            "start-token post-processor would replace."
        )
    if backend.padding is not None or backend.truncation is not None:
        raise TokenizerExportError(f"{name}: its backend pads or truncates.")
    return backend


def _sentencepiece_backend(tokenizer):
    """Rebuilds `sentencepiece`'s BPE encoder and decoder in `tokenizers`."""
    name = type(tokenizer).__name__
    if tokenizer.proto is None:
        raise TokenizerExportError(f"{name}: it has no proto.")
    if tokenizer.add_bos or tokenizer.add_eos:
        raise TokenizerExportError(
            f"{name}: it adds bos/eos to every output (add_bos="
            f"{tokenizer.add_bos}, add_eos={tokenizer.add_eos}); the export "
            "adds the start token only through `add_start_token`."
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.proto)
    _check_sentencepiece_proto(name, proto)
    pieces = list(proto.pieces)
    add_dummy_prefix = proto.normalizer_spec.add_dummy_prefix
    unknown = next(p.piece for p in pieces if p.type == _UNKNOWN)

    backend = Tokenizer(
        models.BPE(
            vocab={p.piece: i for i, p in enumerate(pieces)},
            merges=_sentencepiece_merges(name, pieces),
            unk_token=unknown,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    # sentencepiece prepends the dummy prefix once, to the whole text, and
    # then matches user-defined pieces in the normalized text.
    steps = [normalizers.Prepend(_SPACE)] if add_dummy_prefix else []
    backend.normalizer = normalizers.Sequence(
        steps + [normalizers.Replace(" ", _SPACE)]
    )
    backend.add_tokens(
        [
            AddedToken(
                p.piece,
                special=p.type != _USER_DEFINED,
                normalized=p.type == _USER_DEFINED,
            )
            for p in pieces
            if p.type in (_CONTROL, _UNKNOWN, _USER_DEFINED)
        ]
    )
    backend.decoder = _sentencepiece_decoder(proto, pieces)
    return backend


def _check_sentencepiece_proto(name, proto):
    trainer = proto.trainer_spec
    normalizer = proto.normalizer_spec
    unsupported = []
    if trainer.model_type != _BPE_MODEL:
        model_type = _MODEL_TYPES.get(trainer.model_type, trainer.model_type)
        unsupported.append(f"a {model_type} model (only BPE is exported)")
    if not trainer.byte_fallback:
        unsupported.append("no byte fallback")
    if trainer.treat_whitespace_as_suffix:
        unsupported.append("whitespace as suffix")
    if normalizer.precompiled_charsmap:
        unsupported.append(f"the '{normalizer.name}' normalization rule")
    if normalizer.remove_extra_whitespaces:
        unsupported.append("remove_extra_whitespaces")
    if not normalizer.escape_whitespaces:
        unsupported.append("unescaped whitespace")
    if proto.denormalizer_spec.precompiled_charsmap:
        unsupported.append("a denormalizer")
    user_defined = [p.piece for p in proto.pieces if p.type == _USER_DEFINED]
    if normalizer.add_dummy_prefix and user_defined:
        # tokenizers adds a prefix per span between added tokens (or, with
        # Metaspace, never before a leading one): neither is sentencepiece.
        unsupported.append("a dummy prefix together with user-defined pieces")
    if any(" " in piece for piece in user_defined):
        unsupported.append("user-defined pieces containing spaces")
    reserved = (_CONTROL, _UNKNOWN, _BYTE)
    if any(p.type in reserved and len(p.piece) == 1 for p in proto.pieces):
        unsupported.append("single-character control, unknown or byte pieces")
    if unsupported:
        raise TokenizerExportError(
            f"{name}: its SentencePiece model has {'; '.join(unsupported)}."
        )


def _sentencepiece_merges(name, pieces):
    """Merges that replay sentencepiece's BPE: best piece score first.

    sentencepiece merges any two adjacent symbols whose concatenation is a
    normal (or unused) piece, best score first, leftmost first on ties.
    `tokenizers` ranks merges instead, so every split of every piece becomes
    a merge, ordered by the piece's score. Splits of one piece get adjacent
    ranks, longer left part first; distinct pieces must not tie.
    """
    symbols = {p.piece for p in pieces if p.type in (_NORMAL, _UNUSED)}
    # A user-defined character is cut out of the text before merging, so
    # pieces holding it are out of reach on both sides.
    chars = {
        p.piece
        for p in pieces
        if len(p.piece) == 1 and p.type in (_NORMAL, _UNUSED, _USER_DEFINED)
    }
    scored = []
    seen_scores = {}
    for index, piece in enumerate(pieces):
        if piece.type not in (_NORMAL, _UNUSED):
            continue
        text = piece.piece
        missing = set(text) - chars
        if missing:
            raise TokenizerExportError(
                f"{name}: piece {text!r} holds characters that are not "
                f"pieces themselves ({''.join(sorted(missing))!r}); "
                "sentencepiece can merge them, `tokenizers` byte-falls back."
            )
        splits = [
            (text[:k], text[k:])
            for k in range(len(text) - 1, 0, -1)
            if text[:k] in symbols and text[k:] in symbols
        ]
        if not splits:
            continue
        if piece.type == _UNUSED:
            raise TokenizerExportError(
                f"{name}: unused piece {text!r} can be formed by merges; "
                "sentencepiece re-splits it, `tokenizers` cannot."
            )
        if piece.score in seen_scores:
            raise TokenizerExportError(
                f"{name}: pieces {seen_scores[piece.score]!r} and {text!r} "
                f"tie on score {piece.score}; sentencepiece breaks the tie by "
                "position, `tokenizers` by rank."
            )
        seen_scores[piece.score] = text
        scored.extend((-piece.score, index, split) for split in splits)
    scored.sort(key=lambda item: (item[0], item[1]))
    return [split for _, _, split in scored]


def _sentencepiece_decoder(proto, pieces):
    """Decodes as `SentencePieceProcessor.Decode` does.

    Control pieces decode to nothing and the unknown piece to its surface.
    The dummy prefix is one `▁` stripped from the start of the decoded text,
    as long as no byte or unknown piece comes before it. Two id sequences
    that no text encodes to still decode differently: a run of byte pieces
    that is not valid UTF-8 becomes one U+FFFD per byte (sentencepiece keeps
    the valid characters in it), and byte pieces spelling `▁` decode to a
    space (sentencepiece keeps `▁`).
    """
    control = [p.piece for p in pieces if p.type == _CONTROL]
    unknown = [p.piece for p in pieces if p.type == _UNKNOWN]
    steps = []
    if control:
        pattern = "|".join(re.escape(piece) for piece in control)
        # Oniguruma's `^`/`$` match at line breaks; `\A`/`\z` do not.
        steps.append(decoders.Replace(Regex(rf"\A(?:{pattern})\z"), ""))
    for piece in unknown:
        surface = proto.trainer_spec.unk_surface
        pattern = Regex(rf"\A{re.escape(piece)}\z")
        steps.append(decoders.Replace(pattern, surface))
    steps += [decoders.ByteFallback(), decoders.Fuse()]
    if proto.normalizer_spec.add_dummy_prefix:
        steps.append(decoders.Replace(Regex(rf"\A{_SPACE}"), ""))
    steps.append(decoders.Replace(_SPACE, " "))
    return decoders.Sequence(steps)

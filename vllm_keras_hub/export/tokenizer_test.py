import io
import json
import os
import random
import re

import keras_hub
import pytest
import sentencepiece
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from vllm_keras_hub.export import tokenizer as tokenizer_export
from vllm_keras_hub.export.tokenizer_backends import TokenizerExportError
from vllm_keras_hub.testing import tokenizers as testing_tokenizers

FAMILIES = testing_tokenizers.FAMILIES
CORPUS = testing_tokenizers.TOKENIZER_CORPUS
BPE_FAMILIES = ("gpt2", "opt", "llama3", "qwen", "qwen3")
SENTENCEPIECE_FAMILIES = ("gemma", "gemma3", "llama", "mistral")


def control_tokens(tokenizer):
    """Control pieces the export reads in text while KerasHub spells them."""
    if not isinstance(tokenizer, keras_hub.tokenizers.SentencePieceTokenizer):
        return ()
    proto = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)
    return tuple(
        proto.id_to_piece(i)
        for i in range(proto.get_piece_size())
        if proto.is_control(i) or proto.is_unknown(i)
    )


def without_control_tokens(tokenizer, texts):
    controls = control_tokens(tokenizer)
    return [t for t in texts if not any(c in t for c in controls)]


def keras_hub_ids(tokenizer, text):
    return [int(i) for i in tokenizer(text)]


def start_ids(tokenizer, add_start_token):
    if add_start_token and tokenizer.start_token_id is not None:
        return [tokenizer.start_token_id]
    return []


def export(tmp_path, family, add_start_token=True):
    tokenizer = testing_tokenizers.make_tokenizer(family)
    tokenizer_export.export_tokenizer(tokenizer, str(tmp_path), add_start_token)
    return tokenizer, AutoTokenizer.from_pretrained(str(tmp_path))


def fuzz_texts(count, seed=0):
    """Random mixes of words, whitespace, scripts and special-token text."""
    rng = random.Random(seed)
    characters = "abcxyzABC 019.,;!?'\"<>|/\t\n\réçü日本한😀▁Ġ\u00a0\u3000"
    parts = list(characters) + [
        " the",
        "ing",
        "  ",
        "    ",
        "\n\n",
        "'ll",
        "<s>",
        "</s>",
        "<bos>",
        "<eos>",
        "<pad>",
        "<unk>",
        "<|endoftext|>",
        "<|eot_id|>",
        "<|im_end|>",
        "<start_of_turn>",
        "<img>",
    ]
    return [
        "".join(rng.choice(parts) for _ in range(rng.randint(0, 30)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("add_start_token", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_ids_match_keras_hub(tmp_path, family, add_start_token):
    tokenizer, hf = export(tmp_path, family, add_start_token)
    start = start_ids(tokenizer, add_start_token)
    for text in without_control_tokens(tokenizer, CORPUS):
        ids = keras_hub_ids(tokenizer, text)
        assert hf.encode(text) == start + ids, text
        assert hf(text)["input_ids"] == start + ids, text
        assert hf.encode(text, add_special_tokens=False) == ids, text


@pytest.mark.parametrize("family", FAMILIES)
def test_random_texts_match_keras_hub(tmp_path, family):
    tokenizer, hf = export(tmp_path, family)
    texts = without_control_tokens(tokenizer, fuzz_texts(300))
    assert len(texts) > 100
    expected = [[int(i) for i in ids] for ids in tokenizer.tokenize(texts)]
    assert hf(texts, add_special_tokens=False)["input_ids"] == expected
    assert hf.batch_decode(expected) == tokenizer.detokenize(expected)


@pytest.mark.parametrize("family", SENTENCEPIECE_FAMILIES)
def test_control_tokens_in_text_are_read_as_tokens(tmp_path, family):
    # What chat templates need; KerasHub's sentencepiece spells them out.
    tokenizer, hf = export(tmp_path, family)
    bos = hf.bos_token
    assert bos in control_tokens(tokenizer)
    ids = hf.encode(f"{bos}Hi", add_special_tokens=False)
    assert ids == [tokenizer.start_token_id] + keras_hub_ids(tokenizer, "Hi")
    assert keras_hub_ids(tokenizer, bos) != [tokenizer.start_token_id]


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_matches_keras_hub(tmp_path, family):
    tokenizer, hf = export(tmp_path, family)
    start = start_ids(tokenizer, True)
    for text in CORPUS:
        ids = keras_hub_ids(tokenizer, text)
        end = [tokenizer.end_token_id]
        for sequence in (ids, start + ids, start + ids + end):
            assert hf.decode(sequence) == tokenizer.detokenize(sequence), text


@pytest.mark.parametrize("family", FAMILIES)
def test_skip_special_tokens_drops_start_and_end(tmp_path, family):
    tokenizer, hf = export(tmp_path, family)
    start = start_ids(tokenizer, True)
    end = [tokenizer.end_token_id]
    assert tokenizer.end_token_id in hf.all_special_ids
    assert set(start) <= set(hf.all_special_ids)
    assert hf.decode(start + end, skip_special_tokens=True) == ""
    for text in ("Hello, world!", " two  spaces\n", "日本語 😀"):
        ids = keras_hub_ids(tokenizer, text)
        assert hf.decode(start + ids + end, skip_special_tokens=True) == (
            hf.decode(ids, skip_special_tokens=True)
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_config_names_keras_hub_tokens(tmp_path, family):
    tokenizer, hf = export(tmp_path, family)
    with open(tmp_path / "tokenizer_config.json") as f:
        config = json.load(f)
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "chat_template" not in config
    assert hf.is_fast
    assert hf.chat_template is None
    assert hf.bos_token_id == tokenizer.start_token_id
    assert hf.eos_token_id == tokenizer.end_token_id
    assert config["add_bos_token"] == (tokenizer.start_token_id is not None)
    if getattr(tokenizer, "pad_token", None):
        assert hf.pad_token == tokenizer.pad_token
    with open(tmp_path / "tokenizer.json") as f:
        post_processor = json.load(f)["post_processor"]
    assert post_processor["type"] == "TemplateProcessing"


def test_add_start_token_false_writes_no_start_token(tmp_path):
    _, hf = export(tmp_path, "gemma", add_start_token=False)
    with open(tmp_path / "tokenizer_config.json") as f:
        assert json.load(f)["add_bos_token"] is False
    assert hf.bos_token == "<bos>"
    assert hf.encode("hi")[0] != hf.bos_token_id


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_vllm_tokenizer_loader(tmp_path, family):
    from vllm.tokenizers import get_tokenizer

    from vllm_keras_hub.export import hf_config as config_lib

    tokenizer = testing_tokenizers.make_tokenizer(family)
    tokenizer_export.export_tokenizer(tokenizer, str(tmp_path), True)
    config_lib.register_config()
    config_lib.KerasHubConfig().save_pretrained(str(tmp_path))
    vllm_tokenizer = get_tokenizer(str(tmp_path))
    start = start_ids(tokenizer, True)
    for text in without_control_tokens(tokenizer, CORPUS):
        ids = keras_hub_ids(tokenizer, text)
        assert vllm_tokenizer.encode(text) == start + ids, text
        assert vllm_tokenizer.decode(start + ids) == (
            tokenizer.detokenize(start + ids)
        )


def test_tokenizers_library_reads_the_export(tmp_path):
    tokenizer = testing_tokenizers.make_tokenizer("qwen")
    tokenizer_export.export_tokenizer(tokenizer, str(tmp_path), True)
    backend = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in CORPUS:
        assert backend.encode(text).ids == keras_hub_ids(tokenizer, text)


class OverridingTokenizer(keras_hub.tokenizers.GPT2Tokenizer):
    def tokenize(self, inputs):
        return super().tokenize(inputs)


def unigram_proto():
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["the quick brown fox", "jumps over the dog"]),
        model_writer=model,
        model_type="unigram",
        vocab_size=30,
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    return model.getvalue()


def unsupported_tokenizers():
    tokenizers = keras_hub.tokenizers
    vocabulary, merges = testing_tokenizers.tiny_bpe_vocabulary_and_merges(
        ["<|endoftext|>"]
    )
    dummy_prefix_with_symbols = testing_tokenizers.tiny_sentencepiece_proto(
        layout="llama", user_defined_symbols=("<sep>",)
    )
    gemma_proto = testing_tokenizers.tiny_sentencepiece_proto()
    return {
        "word_piece": (
            tokenizers.WordPieceTokenizer(vocabulary=["[UNK]", "a"]),
            "WordPieceTokenizer: only byte-level BPE",
        ),
        "not_a_tokenizer": (object(), "object: only byte-level BPE"),
        "overridden_tokenize": (
            OverridingTokenizer(vocabulary=vocabulary, merges=merges),
            "OverridingTokenizer: it overrides tokenize",
        ),
        "unigram": (
            tokenizers.SentencePieceTokenizer(proto=unigram_proto()),
            "a Unigram model (only BPE is exported)",
        ),
        "dummy_prefix_with_user_symbols": (
            tokenizers.LlamaTokenizer(proto=dummy_prefix_with_symbols),
            "a dummy prefix together with user-defined pieces",
        ),
        "adds_bos": (
            tokenizers.GemmaTokenizer(proto=gemma_proto, add_bos=True),
            "GemmaTokenizer: it adds bos/eos",
        ),
        "string_output": (
            tokenizers.GPT2Tokenizer(
                vocabulary=vocabulary, merges=merges, dtype="string"
            ),
            "GPT2Tokenizer: it outputs string tokens, not ids.",
        ),
        "sequence_length": (
            tokenizers.GemmaTokenizer(proto=gemma_proto, sequence_length=8),
            "pads or truncates every output to sequence_length=8",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "word_piece",
        "not_a_tokenizer",
        "overridden_tokenize",
        "unigram",
        "dummy_prefix_with_user_symbols",
        "adds_bos",
        "string_output",
        "sequence_length",
    ],
)
def test_unsupported_tokenizer_raises(tmp_path, case):
    tokenizer, message = unsupported_tokenizers()[case]
    error = TokenizerExportError
    with pytest.raises(error, match=re.escape(message)):
        tokenizer_export.export_tokenizer(tokenizer, str(tmp_path), True)
    assert os.listdir(tmp_path) == []


def test_error_is_a_value_error():
    assert issubclass(TokenizerExportError, ValueError)

"""A Hugging Face checkpoint is served with its own `tokenizer.json`.

Tiny checkpoint folders of every converter-backed family we serve
(`testing/hf_tokenizers.py`): the ids vLLM's tokenizer loader gets from the
model folder must be those of the checkpoint's `tokenizer.json`, read by
`tokenizers`, on non-ASCII text, where keras-hub's converted tokenizers
split BERT's and the byte-level BPE families' texts otherwise.
"""

import json
import os
import shutil

import pytest
from tokenizers import Tokenizer

from vllm_keras_hub.export import checkpoint_tokenizer
from vllm_keras_hub.export.preset_folder import PresetError
from vllm_keras_hub.export.preset_folder import read_preset
from vllm_keras_hub.export.preset_folder import read_tokenizers
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.tasks import PoolingTaskError
from vllm_keras_hub.testing.hf_tokenizers import CHECKPOINTS
from vllm_keras_hub.testing.hf_tokenizers import NON_ASCII_TEXTS
from vllm_keras_hub.testing.hf_tokenizers import save_checkpoint
from vllm_keras_hub.testing.tokenizers import TOKENIZER_CORPUS

TEXTS = NON_ASCII_TEXTS + TOKENIZER_CORPUS
# Where keras-hub's converted tokenizer gives other ids than the
# checkpoint's on `NON_ASCII_TEXTS` (so serving it would be wrong): BERT's
# loses accent stripping; the byte-level BPE ones never pre-split; a
# Llama 2 (SentencePiece) checkpoint is converted as Llama 3's byte-level
# BPE. (On
# `TOKENIZER_CORPUS` the SentencePiece ones differ too: in leading spaces
# for Llama's layout, and in special tokens written in text.)
KERAS_HUB_DIFFERS = {
    "bert", "gpt2", "gpt_oss", "llama", "llama3", "qwen", "qwen3", "qwen3_5", "qwen3_5_moe",
    "qwen3_moe", "qwen_moe", "smollm3",
}  # fmt: skip


def _served(folder):
    """The tokenizer vLLM loads from a model folder."""
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(folder)


def _folder(checkpoint, directory, **kwargs):
    os.makedirs(directory)
    assert write_model_folder(checkpoint, directory, **kwargs) == "auto"
    return directory


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    family = request.param
    return family, save_checkpoint(family, str(tmp_path_factory.mktemp(family)))


def test_served_ids_are_the_checkpoints_own(checkpoint, tmp_path):
    family, checkpoint = checkpoint
    served = _served(_folder(checkpoint, str(tmp_path / "folder")))
    own = Tokenizer.from_file(os.path.join(checkpoint, "tokenizer.json"))
    # Decoding as vLLM decodes for the checkpoint itself.
    native = _served(checkpoint)
    for text in TEXTS:
        want = own.encode(text)
        assert served.encode(text) == want.ids, (family, text)
        assert served.encode(text, add_special_tokens=False) == own.encode(
            text, add_special_tokens=False
        ).ids, (family, text)
        for skip in (False, True):
            assert served.decode(want.ids, skip_special_tokens=skip) == native.decode(
                want.ids, skip_special_tokens=skip
            ), (family, text)
    # And where keras-hub's own conversion splits non-ASCII text otherwise.
    _, backbone_config, causal_lm_cls = read_preset(checkpoint)
    converted, _ = read_tokenizers(checkpoint, backbone_config, causal_lm_cls)
    differs = any(
        [int(i) for i in converted.tokenize(text)]
        != own.encode(text, add_special_tokens=False).ids
        for text in NON_ASCII_TEXTS
    )
    assert differs == (family in KERAS_HUB_DIFFERS)


def test_accents_are_stripped_as_the_bert_checkpoint_says(tmp_path):
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    served = _served(_folder(checkpoint, str(tmp_path / "folder")))
    tokens = served.convert_ids_to_tokens(served.encode("Café crème x ²"))
    assert tokens == ["[CLS]", "cafe", "cr", "##eme", "x", "²", "[SEP]"]


def test_a_checkpoint_whose_ids_keras_hub_reads_otherwise_is_refused(tmp_path):
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    path = os.path.join(checkpoint, "vocab.txt")
    with open(path, encoding="utf-8") as f:
        tokens = f.read().splitlines()
    tokens[5], tokens[6] = tokens[6], tokens[5]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    with pytest.raises(PresetError, match=f"reads token id 5 as {tokens[5]!r}"):
        write_model_folder(checkpoint, str(tmp_path))


def test_a_checkpoint_with_ids_past_its_embeddings_is_refused(tmp_path):
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    config = _read(checkpoint, "config.json")
    size = config["vocab_size"] - 1
    with open(os.path.join(checkpoint, "config.json"), "w") as f:
        json.dump({**config, "vocab_size": size}, f)
    with pytest.raises(PresetError, match=f"has id {size}, past the model's {size} embeddings"):
        write_model_folder(checkpoint, str(tmp_path))


@pytest.mark.parametrize(
    "family, cause",
    [("bert", "loses the checkpoint's accent stripping"), ("gpt2", "never splits text")],
    ids=["bert", "gpt2"],
)
def test_a_checkpoint_without_tokenizer_json_keras_hub_cannot_read_is_refused(
    family, cause, tmp_path
):
    checkpoint = save_checkpoint(family, str(tmp_path / family))
    os.remove(os.path.join(checkpoint, "tokenizer.json"))
    with pytest.raises(PresetError, match=f"no tokenizer.json.*{cause}"):
        write_model_folder(checkpoint, str(tmp_path))


def test_a_bert_checkpoint_without_vocab_txt_names_it(tmp_path):
    """keras-hub's converter reads vocab.txt, which one packaging leaves out."""
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    os.remove(os.path.join(checkpoint, "vocab.txt"))
    with pytest.raises(PresetError, match="Cannot read the tokenizer.*vocab.txt"):
        write_model_folder(checkpoint, str(tmp_path))


def test_a_sentencepiece_checkpoint_without_tokenizer_json_is_exported(tmp_path):
    """Its converter runs the checkpoint's own `tokenizer.model`."""
    checkpoint = save_checkpoint("gemma", str(tmp_path / "gemma"))
    own = Tokenizer.from_file(os.path.join(checkpoint, "tokenizer.json"))
    os.remove(os.path.join(checkpoint, "tokenizer.json"))
    served = _served(_folder(checkpoint, str(tmp_path / "folder")))
    for text in NON_ASCII_TEXTS:
        assert served.encode(text) == own.encode(text).ids


def _read(*path):
    with open(os.path.join(*path)) as f:
        return json.load(f)


def test_max_seq_length_caps_the_served_length(tmp_path):
    """As vLLM reads it for the checkpoint itself: the context length, and
    a longer `max_model_len` refused."""
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    with open(os.path.join(checkpoint, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 24, "do_lower_case": False}, f)
    folder = _folder(checkpoint, str(tmp_path / "folder"))
    assert _read(folder, "config.json")["max_position_embeddings"] == 24
    sentence_config = _read(folder, checkpoint_tokenizer.SENTENCE_TRANSFORMERS_CONFIG_FILE)
    assert sentence_config == {"max_seq_length": 24, "do_lower_case": False}
    shorter = _folder(checkpoint, str(tmp_path / "shorter"), max_model_len=16)
    assert _read(shorter, "config.json")["max_position_embeddings"] == 16
    with pytest.raises(PoolingTaskError, match="max_seq_length=24"):
        write_model_folder(checkpoint, str(tmp_path), max_model_len=25)


def test_a_keras_hub_preset_is_served_with_its_own_tokenizer(shared, tmp_path):
    """A preset saved by KerasHub (its `tokenizer.json` is KerasHub's
    config) is exported, not read as a checkpoint's."""
    preset = str(tmp_path / "preset")
    shutil.copytree(shared.embedder("bert_mean"), preset)
    assert not checkpoint_tokenizer.is_checkpoint(preset)
    assert write_model_folder(preset, str(tmp_path)) == "keras_hub_embedder"


@pytest.mark.parametrize("tekken_first", [True, False])
def test_a_mistral_checkpoint_gets_its_preprocessors_tokenizer_class(
    tekken_first, tmp_path, monkeypatch
):
    """KerasHub bug: `Tokenizer.from_preset` picks a Mistral checkpoint's
    tokenizer class in a `set`'s order, so `MistralTekkenTokenizer` (built
    from `tokenizer.model` as if it were a vocabulary) as often as not."""
    from keras_hub.src.utils import preset_utils

    listed = preset_utils.list_subclasses

    def in_order(cls):
        return sorted(
            listed(cls),
            key=lambda c: (c.__name__ != "MistralTekkenTokenizer") == tekken_first,
        )

    monkeypatch.setattr(preset_utils, "list_subclasses", in_order)
    checkpoint = save_checkpoint("mistral", str(tmp_path / "mistral"))
    _folder(checkpoint, str(tmp_path / "folder"))

import json
import os

import keras_hub
import pytest
from transformers import AutoTokenizer

from vllm_keras_hub import families
from vllm_keras_hub.export import embedder as embedder_lib
from vllm_keras_hub.export.keras_hub_tokenizers import KerasHubEmbedderTokenizer
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.testing.embedders import TINY_EMBEDDERS

TEXTS = ["Hi", "Mars is red", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module", params=sorted(TINY_EMBEDDERS))
def exported(request, shared, tmp_path_factory):
    preset = shared.embedder(request.param)
    folder = str(tmp_path_factory.mktemp(request.param))
    mode = write_model_folder(preset, folder)
    return request.param, preset, folder, mode


def _read(folder, *path):
    with open(os.path.join(folder, *path)) as f:
        return json.load(f)


def test_the_tokenizer_packs_texts_as_the_preprocessor_does(exported):
    name, preset, folder, mode = exported
    preprocessor = keras_hub.models.TextEmbedder.from_preset(preset).preprocessor
    packed = preprocessor(TEXTS)
    # BERT's WordPiece and XLM-RoBERTa's unigram SentencePiece do not export.
    encoders = ("bert_mean", "xlm_roberta_cls")
    assert mode == ("keras_hub_embedder" if name in encoders else "auto")
    tokenizer = (
        KerasHubEmbedderTokenizer if name in encoders else AutoTokenizer
    ).from_pretrained(folder)
    for text, ids, mask in zip(TEXTS, packed["token_ids"], packed["padding_mask"]):
        assert tokenizer(text)["input_ids"] == [int(i) for i in ids[mask.bool()]]


def test_the_folder_says_how_the_preset_pools(exported):
    name, _, folder, _ = exported
    config = _read(folder, "config.json")
    assert config["architectures"] == ["KerasHubTorchForEmbedding"]
    modules = [module["type"].rpartition(".")[2] for module in _read(folder, "modules.json")]
    pooling = _read(folder, "1_Pooling", "config.json")["pooling_mode"]
    want = {
        "embedding_gemma": ("mean", True, 256, False, 32),
        "gemma3_last": ("lasttoken", True, 128, True, None),
        "qwen3_last": ("lasttoken", True, 128, True, None),
        "qwen3_mean": ("mean", False, 128, True, None),
        "bert_mean": ("mean", True, 128, False, None),
        "xlm_roberta_cls": ("cls", True, 128, False, None),
    }[name]
    got = (
        pooling,
        "Normalize" in modules,
        config["embedding_size"],
        config["is_causal"],
        config["keras_hub_embedder"]["max_tokens"],
    )
    assert got == want
    # No Dense module: vLLM would run its own copy of the projection.
    assert set(modules) <= {"Pooling", "Normalize"}
    if name == "embedding_gemma":
        assert config["matryoshka_dimensions"] == [256, 128]
        assert config["max_position_embeddings"] == 32


@pytest.mark.parametrize(
    "window, served", [(512, 256), (64, 32), (8, 4), (7, 4), (5, 3)]
)
def test_the_exact_length_is_the_shorter_side_of_the_band_plus_one(window, served):
    config = {"use_sliding_window_attention": True, "sliding_window_size": window}
    assert embedder_lib.bidirectional_window_limit(config) == served
    # The band of `_compute_bidirectional_sliding_mask`: every pair of
    # tokens within `served` tokens is inside it, and one more is not.
    right = window // 2
    left = window - right - 1
    assert served - 1 <= min(left, right) and served > min(left, right)


def test_a_generating_preset_is_no_embedder(shared):
    preset = shared.preset("qwen3")
    config = _read(preset, "config.json")["config"]
    family = families.family_by_name("qwen3")
    assert embedder_lib.read_embedder(preset, family, config) is None


# vLLM loads a tokenizer mode's class in its front-end process; plain
# `vllm serve` in a user's shell has set no Keras backend there.
_LOAD_IN_A_FRESH_SHELL = """
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.tokenizers.registry import get_tokenizer
print(get_tokenizer(sys.argv[1], tokenizer_mode=sys.argv[2]).encode(sys.argv[3]))
"""


@pytest.mark.parametrize("mode", ["keras_hub_embedder", "keras_hub"])
def test_keras_hub_tokenizer_modes_load_in_a_fresh_shell(shared, tmp_path, mode):
    import subprocess
    import sys

    from vllm_keras_hub.testing.user_env import user_env

    preset = shared.embedder("bert_mean")
    folder = str(tmp_path / "folder")
    write_model_folder(preset, folder)
    ids = keras_hub.tokenizers.Tokenizer.from_preset(preset)("mars is red").tolist()
    start, end = 2, 3  # [CLS], [SEP]
    want = [start, *ids, end] if mode == "keras_hub_embedder" else [start, *ids]
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_A_FRESH_SHELL, folder, mode, "mars is red"],
        env=user_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(want)

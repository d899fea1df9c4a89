import json
import os
import shutil
import subprocess

import keras_hub
import pytest

from vllm_keras_hub.export import backbone_fields
from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export import model_folder
from vllm_keras_hub.export import preset_folder
from vllm_keras_hub import families
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import build_tiny_preset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    built = {}

    def get(family):
        if family not in built:
            built[family] = build_tiny_preset(
                family, str(tmp_path_factory.mktemp(family))
            )
        return built[family]

    return get


def read(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def test_folder_holds_config_tokenizer_and_generation_config_but_no_weights(tiny):
    folder = model_folder.ModelFolder(tiny("llama3"))
    try:
        files = sorted(os.listdir(folder.path))
        assert "config.json" in files and "generation_config.json" in files
        assert "tokenizer.json" in files
        assert not [f for f in files if f.endswith((".safetensors", ".bin", ".h5"))]
        config = read(folder.path, "config.json")
        assert config["architectures"] == ["KerasHubTorchForCausalLM"]
        assert config["model_type"] == "keras_hub_torch"
        assert config["keras_hub_preset"] == os.path.abspath(tiny("llama3"))
        assert config["keras_hub_family"] == "llama3"
        assert config["num_hidden_layers"] == 2
        assert config["num_attention_heads"] == 4
        assert config["num_key_value_heads"] == 2
        assert config["head_dim"] == 32
        assert config["hidden_size"] == 128
    finally:
        folder.cleanup()
    assert not os.path.exists(folder.path)


def test_max_model_len_becomes_the_position_limit(tiny):
    folder = model_folder.ModelFolder(tiny("qwen"), max_model_len=100)
    try:
        assert read(folder.path, "config.json")["max_position_embeddings"] == 100
    finally:
        folder.cleanup()


def test_learned_positions_cap_the_context(tiny):
    folder = model_folder.ModelFolder(tiny("gpt2"))
    try:
        assert read(folder.path, "config.json")["max_position_embeddings"] == 256
    finally:
        folder.cleanup()


@pytest.mark.parametrize(
    "family, stop_tokens",
    [
        ("llama3", ["<|end_of_text|>", "<|eot_id|>"]),
        ("gemma3", ["<eos>", "<end_of_turn>"]),
        ("gemma", ["<eos>", "<end_of_turn>"]),  # the chat format's turn end
        ("gemma3n", ["<eos>", "<end_of_turn>"]),
        ("gemma4", ["<eos>", "<turn|>"]),
        ("gpt2", ["<|endoftext|>"]),
    ],
)
def test_stop_ids_are_generates_and_the_chat_formats(tiny, family, stop_tokens):
    folder = model_folder.ModelFolder(tiny(family))
    try:
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(tiny(family))
        expected = [tokenizer.token_to_id(token) for token in stop_tokens]
        assert read(folder.path, "generation_config.json")["eos_token_id"] == expected
    finally:
        folder.cleanup()


@pytest.mark.parametrize(
    "family, fields",
    [
        ("gemma", {"do_sample": False, "temperature": 0.0}),
        ("gemma3", {"do_sample": False, "temperature": 0.0}),
        ("gemma3n", {"do_sample": False, "temperature": 0.0}),
        ("gemma4", {"do_sample": False, "temperature": 0.0}),
        ("mistral", {"do_sample": True, "temperature": 1.0, "top_k": 5}),
    ],
)
def test_generation_config_carries_the_default_sampler(tiny, family, fields):
    folder = model_folder.ModelFolder(tiny(family))
    try:
        generation_config = read(folder.path, "generation_config.json")
        assert {key: generation_config.get(key) for key in fields} == fields
    finally:
        folder.cleanup()


def test_unknown_preset_names_the_preset_and_cause(tmp_path):
    missing = str(tmp_path / "no_such_preset")
    with pytest.raises(preset_folder.PresetError, match="no_such_preset"):
        model_folder.ModelFolder(missing)
    with pytest.raises(preset_folder.PresetError, match="not_a_preset_name_xyz"):
        model_folder.ModelFolder("not_a_preset_name_xyz")


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    backbone = keras_hub.models.RWKV7Backbone(
        hidden_size=64, head_size=32, num_layers=1, vocabulary_size=64, intermediate_dim=64
    )
    backbone.save_to_preset(str(tmp_path))
    with pytest.raises(families.UnsupportedFamilyError) as error:
        model_folder.ModelFolder(str(tmp_path))
    message = str(error.value)
    assert "RWKV7" in message and "recurrent state" in message
    for name in families.supported_families():
        assert name in message


def test_model_dims_reads_smollm3_attention_heads():
    dims = backbone_fields.model_dims(
        {
            "vocabulary_size": 600,
            "hidden_dim": 128,
            "num_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )
    assert dims["num_attention_heads"] == 4
    assert dims["num_key_value_heads"] == 2
    assert dims["head_dim"] == 32


def test_model_dims_reads_gemma3n_text_names():
    dims = backbone_fields.model_dims(
        {
            "text_vocab_size": 600,
            "text_hidden_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "max_position_embeddings": 256,
        }
    )
    assert dims == {
        "vocab_size": 600,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
    }


def test_chat_template_is_the_familys_or_a_clear_refusal(tiny):
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Hi"}]
    folder = model_folder.ModelFolder(tiny("gemma"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path)
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        with pytest.raises(TemplateError, match="Unknown role wizard"):
            tokenizer.apply_chat_template(
                [{"role": "wizard", "content": "Hi"}], tokenize=False
            )
    finally:
        folder.cleanup()
    folder = model_folder.ModelFolder(tiny("gpt2"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path)
        with pytest.raises(
            TemplateError, match="GPT-2 presets have no chat format.*--chat-template"
        ):
            tokenizer.apply_chat_template(messages, tokenize=False)
    finally:
        folder.cleanup()


# The families the README's matrix marks "none (400)". The GPT-2 server test
# (cli_test.py) proves vLLM answers this template's error with a 400.
FAMILIES_WITHOUT_CHAT = sorted(
    family.name
    for family in families.FAMILIES
    if family.route and family.name in TINY_FAMILIES and not chat_templates.chat_format(family.name)
)


@pytest.mark.parametrize("family", FAMILIES_WITHOUT_CHAT)
def test_a_family_without_chat_format_gets_the_clear_refusal(tiny, family):
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    folder = model_folder.ModelFolder(tiny(family))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path)
        with pytest.raises(TemplateError, match="no chat format.*--chat-template"):
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "Hi"}], tokenize=False
            )
    finally:
        folder.cleanup()


def test_same_preset_and_settings_share_one_folder_until_the_last_lets_go(tiny):
    first = model_folder.ModelFolder(tiny("gpt2"))
    second = model_folder.ModelFolder(tiny("gpt2"))
    other = model_folder.ModelFolder(tiny("gpt2"), max_model_len=100)
    try:
        # vLLM keys its compile caches by this path: it must be stable.
        assert first.path == second.path != other.path
        first.cleanup()
        first.cleanup()
        assert read(second.path, "config.json")["keras_hub_family"] == "gpt2"
    finally:
        second.cleanup()
        other.cleanup()
    assert not os.path.exists(first.path) and not os.path.exists(other.path)


def test_the_folder_follows_every_backbone_setting_but_the_name(tiny, tmp_path):
    """Settings beyond the dims (here RoPE's wavelength) key the folder too.

    vLLM loads the compile it saved for the same folder without checking the
    model (`saved_compile`); a stale one would bake in the old setting. The
    name Keras numbers per process (`llama3_backbone_1`) must not matter, or
    a preset saved again would never reuse its compile.
    """
    preset = str(tmp_path / "preset")
    shutil.copytree(tiny("llama3"), preset)

    def folder_after(change):
        saved = read(preset, "config.json")
        change(saved["config"])
        with open(os.path.join(preset, "config.json"), "w") as f:
            json.dump(saved, f)
        return model_folder.ModelFolder(preset)

    folders = [
        model_folder.ModelFolder(preset),
        folder_after(lambda config: config.update(name="llama3_backbone_7")),
        folder_after(lambda config: config.update(rope_max_wavelength=20000)),
    ]
    try:
        paths = [folder.path for folder in folders]
        assert paths[0] == paths[1] != paths[2]
        digests = [read(path, "config.json")["keras_hub_config_digest"] for path in paths]
        assert digests[0] == digests[1] != digests[2]
    finally:
        for folder in folders:
            folder.cleanup()


def test_a_dead_process_does_not_keep_a_folder(tiny):
    folder = model_folder.ModelFolder(tiny("gpt2"))
    # A user that died without cleaning up (SIGKILL) still has its marker.
    open(os.path.join(folder.path + ".users", f"{_finished_pid()}-crashed"), "w").close()
    folder.cleanup()
    assert not os.path.exists(folder.path)


def _finished_pid():
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_gemma4_chat_prompt_tokenizes_its_turn_pieces_whole(tiny):
    from transformers import AutoTokenizer

    folder = model_folder.ModelFolder(tiny("gemma4"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        # As vLLM tokenizes a rendered chat prompt.
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        keras_tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(tiny("gemma4"))
        turn, turn_end = (
            keras_tokenizer.token_to_id(token) for token in ("<|turn>", "<turn|>")
        )
        # The official template closes an empty thought channel when thinking is off.
        text = "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
        expected = [keras_tokenizer.start_token_id] + [
            int(i) for i in keras_tokenizer(text)
        ]
        assert list(ids) == expected
        assert expected.count(turn) == 2 and expected.count(turn_end) == 1
    finally:
        folder.cleanup()

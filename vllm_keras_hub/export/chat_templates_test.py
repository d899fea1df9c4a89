import json
import time

import pytest

from vllm_keras_hub import gguf_preset
from vllm_keras_hub.export import chat_templates
from vllm_keras_hub import families
from vllm_keras_hub.testing import support_matrix

# Each family's bos and eos strings, as its exported tokenizer names them.
_SPECIAL_TOKENS = {
    "gemma": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "gemma3n": ("<bos>", "<eos>"),
    "gemma4": ("<bos>", "<eos>"),
    "llama": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("<s>", "</s>"),
    "mixtral": ("<s>", "</s>"),
    "qwen": (None, "<|endoftext|>"),
    "qwen_moe": (None, "<|endoftext|>"),
    "qwen3": (None, "<|im_end|>"),
    "qwen3_moe": (None, "<|im_end|>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "qwen3_5": (None, "<|im_end|>"),
    "qwen3_5_moe": (None, "<|im_end|>"),
    "smollm3": ("<|begin_of_text|>", "<|im_end|>"),
    "gpt_oss": (None, "<|endoftext|>"),
    "pali_gemma": ("<bos>", "<eos>"),
}

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]

_GEMMA = (
    "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
    "<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nHow are you?<end_of_turn>\n"
    "<start_of_turn>model\n"
)
_MISTRAL = (
    "<s> [INST] You are terse.\n\nHi [/INST] Hello!</s>"
    " [INST] How are you? [/INST]"
)
_CHATML = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nHow are you?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

EXPECTED = {
    "gemma": _GEMMA,
    "gemma3": _GEMMA,
    "gemma3n": _GEMMA,
    # vLLM hands Gemma 4's template the system text as a part, which it
    # follows with a space; thinking off closes an empty thought channel.
    "gemma4": (
        "<bos><|turn>system\nYou are terse. <turn|>\n"
        "<|turn>user\nHi<turn|>\n"
        "<|turn>model\nHello!<turn|>\n"
        "<|turn>user\nHow are you?<turn|>\n"
        "<|turn>model\n<|channel>thought\n<channel|>"
    ),
    "llama": (
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello! </s>"
        "<s>[INST] How are you? [/INST]"
    ),
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "mistral": _MISTRAL,
    "mixtral": _MISTRAL,
    "qwen": _CHATML,
    "qwen_moe": _CHATML,
    "qwen3": _CHATML,
    "qwen3_moe": _CHATML,
    # Qwen3.5 thinks by default: the generation prompt opens the block.
    "qwen3_5": _CHATML + "<think>\n",
    "qwen3_5_moe": _CHATML + "<think>\n",
    # SmolLM3's official template closes its system turn only after tools.
    "smollm3": (
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
        "Today Date: {today}\nReasoning Mode: /think\n\n"
        "## Custom Instructions\n\nYou are terse.\n\n"
        + _CHATML[_CHATML.index("<|im_start|>user") :]
    ),
    # Harmony: the system message becomes the developer's instructions.
    "gpt_oss": (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained "
        "by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {date}\n\n"
        "Reasoning: medium\n\n# Valid channels: analysis, commentary, final. "
        "Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        "<|start|>user<|message|>How are you?<|end|><|start|>assistant"
    ),
    "phi3": (
        "<|system|>\nYou are terse.<|end|>\n"
        "<|user|>\nHi<|end|>\n"
        "<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nHow are you?<|end|>\n"
        "<|assistant|>\n"
    ),
}


def _hf_tokenizer(family_name, special_tokens=None):
    """A word-level tokenizer with the family's bos and eos, for rendering."""
    import tokenizers
    import transformers

    bos, eos = special_tokens or _SPECIAL_TOKENS[family_name]
    specials = [token for token in ("<unk>", bos, eos) if token]
    vocab = {token: i for i, token in enumerate(specials)}
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab, unk_token="<unk>")
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token=bos, eos_token=eos
    )


def _render(family_name, messages, **kwargs):
    """Renders as vLLM's chat path does, through its own entry point.

    A template that takes a message's parts (vLLM's "openai" content
    format) gets every message's content as parts, as vLLM's
    `_parse_chat_message_content` hands them.
    """
    from vllm.renderers.hf import _detect_content_format
    from vllm.renderers.hf import safe_apply_chat_template

    template = chat_templates.chat_format(family_name).template
    if _detect_content_format(template, default="openai") == "openai":
        messages = [
            {**m, "content": [{"type": "text", "text": m["content"]}]}
            if isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
    kwargs.setdefault("add_generation_prompt", True)
    return safe_apply_chat_template(
        None,  # Only read when no chat template is given.
        _hf_tokenizer(family_name),
        messages,
        chat_template=template,
        tokenize=False,
        **kwargs,
    )


@pytest.mark.parametrize("family_name", sorted(EXPECTED))
def test_renders_system_user_assistant_user(family_name):
    expected = EXPECTED[family_name].replace("{today}", time.strftime("%d %B %Y"))
    expected = expected.replace("{date}", time.strftime("%Y-%m-%d"))
    assert _render(family_name, CONVERSATION) == expected
    support_matrix.record_chat(family_name, "renders")


def test_expected_covers_every_chat_format():
    with_format = {
        family.name
        for family in families.FAMILIES
        if chat_templates.chat_format(family.name)
    }
    # PaliGemma takes one prompt, not a conversation (tested below).
    assert with_format == set(EXPECTED) | {"pali_gemma"}


def test_pali_gemma_renders_one_prompt_and_refuses_conversations():
    from vllm.exceptions import VLLMValidationError

    message = {
        "role": "user",
        "content": [{"type": "image_url"}, {"type": "text", "text": "caption en"}],
    }
    assert _render("pali_gemma", [message]) == "<bos>caption en\n"
    with pytest.raises(VLLMValidationError, match="single user message"):
        _render("pali_gemma", CONVERSATION)
    support_matrix.record_chat("pali_gemma", "one prompt, no conversation")


def test_llama3_without_system_starts_with_bos_once():
    rendered = _render("llama3", CONVERSATION[1:2])
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_gemma_without_system_and_trims_content():
    rendered = _render("gemma", [{"role": "user", "content": "  Hi \n"}])
    assert rendered == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_gemma4_without_system_and_trims_content():
    rendered = _render("gemma4", [{"role": "user", "content": "  Hi \n"}])
    assert rendered == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def test_gemma_without_generation_prompt():
    rendered = _render("gemma3", CONVERSATION[:3], add_generation_prompt=False)
    assert rendered == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
    )


def test_qwen_default_system_prompts():
    user_only = [{"role": "user", "content": "Hi"}]
    assert _render("qwen", user_only) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render("qwen_moe", user_only) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render("qwen3", user_only) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_drops_past_reasoning():
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "How are you?"},
    ]
    assert _render("qwen3", messages) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen3_enable_thinking_false_writes_empty_think_block():
    rendered = _render(
        "qwen3", [{"role": "user", "content": "Hi"}], enable_thinking=False
    )
    assert rendered == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.mark.parametrize(
    "family_name, messages, message",
    [
        (
            "gemma",
            [{"role": "assistant", "content": "Hi"}],
            "Conversation roles must alternate",
        ),
        (
            "llama",
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "Conversation roles must alternate",
        ),
        (
            "mistral",
            [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
            "Only user and assistant roles are supported",
        ),
        (
            "qwen3_5",
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            "System message must be at the beginning",
        ),
    ],
)
def test_forbidden_conversations_raise_the_template_message(
    family_name, messages, message
):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=message):
        _render(family_name, messages)


# The families whose templates take a message's parts: those served with
# images, and Qwen3.5's official template (images and video).
IMAGE_FAMILIES = ("gemma3", "gemma3n", "gemma4", "qwen3_5", "qwen3_5_moe")


def test_vllm_passes_string_content_and_image_families_parts():
    from vllm.renderers.hf import _detect_content_format

    for family_name in EXPECTED:
        template = chat_templates.chat_format(family_name).template
        # To put images where they stand.
        expected = "openai" if family_name in IMAGE_FAMILIES else "string"
        assert _detect_content_format(template, default="openai") == expected


@pytest.mark.parametrize(
    "family_name, expected",
    [
        (
            "gemma3",
            "<bos><start_of_turn>user\nLook:<start_of_image>what is it?"
            "<end_of_turn>\n<start_of_turn>model\n",
        ),
        (
            "gemma3n",
            "<bos><start_of_turn>user\nLook:<start_of_image>what is it?"
            "<end_of_turn>\n<start_of_turn>model\n",
        ),
        (
            "gemma4",
            "<bos><|turn>user\nLook:<|image|>what is it?<turn|>\n"
            "<|turn>model\n<|channel>thought\n<channel|>",
        ),
    ],
)
def test_an_image_part_stands_where_it_is(family_name, expected):
    import jinja2

    template = chat_templates.chat_format(family_name).template
    parts = [
        {"type": "text", "text": "Look: "},
        {"type": "image"},
        {"type": "text", "text": " what is it?"},
    ]
    rendered = jinja2.Environment().from_string(template).render(
        bos_token="<bos>",
        messages=[{"role": "user", "content": parts}],
        add_generation_prompt=True,
    )
    assert rendered == expected


def test_a_gemma3n_audio_part_stands_where_it_is():
    """As its preprocessor's placeholder; Gemma 3's template takes no audio."""
    import jinja2

    parts = [
        {"type": "text", "text": "Hear: "},
        {"type": "audio"},
        {"type": "text", "text": " what is it?"},
    ]
    rendered = {}
    for family_name in ("gemma3", "gemma3n"):
        template = chat_templates.chat_format(family_name).template
        rendered[family_name] = jinja2.Environment().from_string(template).render(
            bos_token="<bos>",
            messages=[{"role": "user", "content": parts}],
            add_generation_prompt=True,
        )
    assert rendered["gemma3n"] == (
        "<bos><start_of_turn>user\nHear:<start_of_audio>what is it?"
        "<end_of_turn>\n<start_of_turn>model\n"
    )
    assert "<start_of_audio>" not in rendered["gemma3"]


def test_every_chat_format_has_turn_end_tokens():
    for family in families.FAMILIES:
        chat_format = chat_templates.chat_format(family.name)
        if chat_format is None:
            continue
        assert chat_format.turn_end_tokens, family.name
        assert all(isinstance(t, str) and t for t in chat_format.turn_end_tokens)
        for token in family.stop_tokens:
            assert token in chat_format.turn_end_tokens, family.name


@pytest.mark.parametrize(
    "family_name", ["gpt2", "opt", "gpt_neox", "bloom", "falcon"]
)
def test_families_without_chat_format(family_name):
    families.family_by_name(family_name)
    assert chat_templates.chat_format(family_name) is None
    support_matrix.record_chat(family_name, "none")


def test_unknown_family_has_no_chat_format():
    assert chat_templates.chat_format("no_such_family") is None


def test_chat_format_is_frozen():
    chat_format = chat_templates.chat_format("gemma")
    with pytest.raises(AttributeError):
        chat_format.template = ""


def test_help_names_both_ways_to_pass_a_template():
    assert "--chat-template" in chat_templates.NO_CHAT_TEMPLATE_HELP
    assert "chat_template=" in chat_templates.NO_CHAT_TEMPLATE_HELP
    assert "LLM.chat" in chat_templates.NO_CHAT_TEMPLATE_HELP


def test_preset_chat_template_file(tmp_path):
    template = "{{ messages[0]['content'] }}"
    (tmp_path / gguf_preset.CHAT_TEMPLATE_FILE).write_text(template)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "not this one"})
    )
    assert chat_templates.preset_chat_template(str(tmp_path)) == template


def test_preset_without_chat_template(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert chat_templates.preset_chat_template(str(tmp_path)) is None


def test_preset_tokenizer_config_chat_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ bos_token }}"})
    )
    assert chat_templates.preset_chat_template(str(tmp_path)) == "{{ bos_token }}"


def test_preset_tokenizer_config_named_chat_templates(tmp_path):
    named = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "plain"},
    ]
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": named})
    )
    assert chat_templates.preset_chat_template(str(tmp_path)) == "plain"


def test_preset_tokenizer_config_without_chat_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>"})
    )
    assert chat_templates.preset_chat_template(str(tmp_path)) is None

"""Tool calls and thinking in the maintained chat formats, rendered as vLLM does.

Each family with a tool format renders a conversation with a system message,
a tool, the model's call and the tool's result through vLLM's own chat
template entry point, and gets what the official template (the pinned copy
in `official_templates.OFFICIAL_SOURCES`) renders, with the call and result
in the format its model card documents. `tests/chat_tools_server_test.py` checks
the same through a server, token for token, and the parsers on the output.
"""

import types

import pytest

from vllm_keras_hub import settings
from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export.chat_templates_test import _hf_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call12345",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": '{"sky": "sunny"}'},
]
_HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
_QWEN_RESULT = '<|im_start|>user\n<tool_response>\n{"sky": "sunny"}\n</tool_response><|im_end|>\n'

# family: (official template, tool parser, reasoning parser, what the call
# and the result render as, per the model's documented format).
TOOL_FAMILIES = {
    "qwen": ("qwen2_5", "hermes", None, (_HERMES_CALL, _QWEN_RESULT)),
    "qwen3": ("qwen3", "hermes", "qwen3", (_HERMES_CALL, _QWEN_RESULT)),
    "qwen3_moe": ("qwen3", "hermes", "qwen3", (_HERMES_CALL, _QWEN_RESULT)),
    "qwen3_5": (
        "qwen3_5",
        "qwen3_coder",
        "qwen3",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call>",
            _QWEN_RESULT,
        ),
    ),
    "gemma4": (
        "gemma4",
        "gemma4",
        "gemma4",
        (
            '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
            '<|tool_response>response:get_weather{value:<|"|>{"sky": "sunny"}<|"|>}'
            "<tool_response|>",
        ),
    ),
    "gpt_oss": (
        "gpt_oss",
        "hf",
        "hf",
        (
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
            '<|message|>{"city": "Paris"}<|call|>',
            "<|start|>functions.get_weather to=assistant<|channel|>commentary"
            '<|message|>"{\\"sky\\": \\"sunny\\"}"<|end|>',
        ),
    ),
    "llama3": (
        "llama3_1",
        "llama3_json",
        None,
        (
            '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
            '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"sky\\": \\"sunny\\"}"<|eot_id|>',
        ),
    ),
}
_VOCABULARY = {"llama3": ("<|python_tag|>",)}
_TOKENS = {
    "qwen": (None, "<|endoftext|>"),
    "qwen3": (None, "<|im_end|>"),
    "qwen3_moe": (None, "<|im_end|>"),
    "qwen3_5": (None, "<|im_end|>"),
    "gemma4": ("<bos>", "<eos>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "gpt_oss": (None, "<|endoftext|>"),
}


def _render(template, family_name, messages, **kwargs):
    from vllm.renderers.hf import _detect_content_format
    from vllm.renderers.hf import safe_apply_chat_template

    if _detect_content_format(template, default="openai") == "openai":
        messages = [
            {**m, "content": [{"type": "text", "text": m["content"]}]}
            if isinstance(m.get("content"), str) and m["role"] in ("system", "user")
            else m
            for m in messages
        ]
    return safe_apply_chat_template(
        None,
        _hf_tokenizer(family_name, _TOKENS[family_name]),
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )


@pytest.mark.parametrize("family_name", sorted(TOOL_FAMILIES))
def test_a_tool_conversation_renders_as_the_official_template(family_name):
    official, tool_parser, reasoning_parser, (call, result) = TOOL_FAMILIES[family_name]
    chat_format = chat_templates.chat_format(family_name, _VOCABULARY.get(family_name, ()))
    assert chat_format.template == chat_templates.official_template(official)
    assert (chat_format.tool_parser, chat_format.reasoning_parser) == (
        tool_parser,
        reasoning_parser,
    )
    rendered = _render(chat_format.template, family_name, CONVERSATION, tools=[TOOL])
    assert call in rendered and result in rendered, rendered
    assert "You are a weather bot." in rendered and "get_weather" in rendered
    assert rendered.index("get_weather") < rendered.index(call)  # the tool is declared


def test_every_parser_a_format_names_is_one_of_vllms():
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    formats = [chat_templates.chat_format(name) for name in chat_templates._CHAT_FORMATS]
    formats.append(chat_templates.chat_format("llama3", _VOCABULARY["llama3"]))
    tool_parsers = {f.tool_parser for f in formats} - {None}
    reasoning_parsers = {f.reasoning_parser for f in formats} - {None}
    assert tool_parsers == {"hermes", "qwen3_coder", "gemma4", "llama3_json", "hf"}
    assert reasoning_parsers == {"qwen3", "gemma4", "hf"}
    for name in tool_parsers:
        assert ToolParserManager.get_tool_parser(name) is not None
    for name in reasoning_parsers:
        assert ReasoningParserManager.get_reasoning_parser(name) is not None


@pytest.mark.parametrize(
    "output, expected",
    [
        (
            "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>"
            "final<|message|>Sunny.<|return|>",
            {"thinking": "Hm.", "content": "Sunny."},
        ),
        # The call addressed after the channel, as the model card writes it,
        # and before it, as the official template does; its stop token
        # (`<|call|>`) is not in the text vLLM parses.
        (
            "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}',
            {"thinking": "Hm.", "call": ("get_weather", {"city": "Rome"})},
        ),
        (
            "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions."
            'get_weather<|channel|>commentary json<|message|>{"city": "Rome"}',
            {"thinking": "Hm.", "call": ("get_weather", {"city": "Rome"})},
        ),
    ],
    ids=["final", "call-after-channel", "call-before-channel"],
)
def test_gpt_oss_response_template_reads_harmony(output, expected):
    from vllm.parser.chat_parsing import ResponseParser

    parser = ResponseParser(
        chat_templates.GPT_OSS_RESPONSE_TEMPLATE, prefix="<|start|>assistant"
    )
    parser.feed(output)
    message, _ = parser.finalize()
    got = {"thinking": message.get("thinking")}
    if "content" in message:
        got["content"] = message["content"]
    for call in message.get("tool_calls", []):
        got["call"] = (call["function"]["name"], call["function"]["arguments"])
    assert got == expected


def test_llama3_1_is_told_apart_by_its_vocabulary():
    assert chat_templates.chat_format("llama3").tool_parser is None
    assert chat_templates.chat_format("llama3", {"<|python_tag|>"}).tool_parser == "llama3_json"


@pytest.mark.parametrize(
    "enable_thinking, generation_prompt",
    [(None, "<|im_start|>assistant\n"), (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n")],
)
def test_qwen3_thinking_switch(enable_thinking, generation_prompt):
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    template = chat_templates.chat_format("qwen3").template
    rendered = _render(template, "qwen3", CONVERSATION[1:2], **kwargs)
    assert rendered.endswith(generation_prompt)


def test_gemma4_thinking_switch():
    template = chat_templates.chat_format("gemma4").template
    on = _render(template, "gemma4", CONVERSATION[:2], enable_thinking=True)
    off = _render(template, "gemma4", CONVERSATION[:2])
    assert on.startswith("<bos><|turn>system\n<|think|>\n") and on.endswith("<|turn>model\n")
    assert "<|think|>" not in off and off.endswith("<|turn>model\n<|channel>thought\n<channel|>")


def _folder(tool_parser, reasoning_parser):
    return types.SimpleNamespace(tool_parser=tool_parser, reasoning_parser=reasoning_parser)


def test_serve_sets_the_formats_parsers():
    assert settings.chat_parser_flags(_folder("hermes", "qwen3"), {}) == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
    }
    assert settings.chat_parser_flags(_folder(None, None), {}) == {}


def test_the_users_parser_flags_win():
    folder = _folder("hermes", "qwen3")
    chosen = {"tool_call_parser": "pythonic", "reasoning_parser": "deepseek_r1"}
    assert settings.chat_parser_flags(folder, chosen) == {}
    plugin = {"tool_parser_plugin": "my_parser.py"}
    assert settings.chat_parser_flags(folder, plugin) == {"reasoning_parser": "qwen3"}


def test_a_call_the_format_cannot_express_is_refused_by_its_template():
    from vllm.exceptions import VLLMValidationError

    two_calls = [dict(CONVERSATION[2]["tool_calls"][0], id=f"call{i}") for i in range(2)]
    messages = [*CONVERSATION[:2], {**CONVERSATION[2], "tool_calls": two_calls}]
    template = chat_templates.chat_format("llama3", _VOCABULARY["llama3"]).template
    with pytest.raises(VLLMValidationError, match="only supports single tool-calls"):
        _render(template, "llama3", messages, tools=[TOOL])


def _family(name):
    from vllm_keras_hub import families

    return families.family_by_name(name)


def test_a_presets_own_template_gets_the_parsers_of_what_it_renders(tmp_path):
    from vllm_keras_hub.export.preset_chat import ROLE_GUARD
    from vllm_keras_hub.export.preset_chat import chat_format_of

    own = chat_templates.official_template("gpt_oss")
    (tmp_path / chat_templates.CHAT_TEMPLATE_FILE).write_text(own)
    chat_format = chat_format_of(str(tmp_path), _family("gpt_oss"), set())
    assert chat_format.template == ROLE_GUARD + own
    assert (chat_format.tool_parser, chat_format.reasoning_parser) == ("hf", "hf")
    # The family's format: its output regions and turn ends come along.
    assert chat_format.response_template == chat_templates.GPT_OSS_RESPONSE_TEMPLATE
    assert chat_format.turn_end_tokens == ("<|return|>", "<|call|>")


def test_a_presets_own_template_without_tools_or_thinking_gets_no_parsers(tmp_path):
    from vllm_keras_hub.export.preset_chat import chat_format_of

    (tmp_path / chat_templates.CHAT_TEMPLATE_FILE).write_text("{{ messages[0]['content'] }}")
    chat_format = chat_format_of(str(tmp_path), _family("qwen3"), set())
    assert (chat_format.tool_parser, chat_format.reasoning_parser) == (None, None)
    assert chat_format.turn_end_tokens == ()

"""Each tool format on our exported tokenizer: its prompt, and vLLM's parsers.

For every family whose chat format names parsers, vLLM composes them as its
server does (`ParserManager.get_parser`, which also checks them against the
tokenizer at start-up) on the exported tokenizer of a tiny vocabulary with
the published tool and thinking tokens, and parses what a trained model
writes in that format. A conversation with tools, a call and its result
tokenizes, as vLLM renders it, to the ids of the official template's text in
the family's own KerasHub tokenizer. `tests/chat_tools_server_test.py` runs the same
through servers, streamed too, for every family here but SmolLM3 (no tools).
"""

import json

import pytest

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export.preset_chat import add_response_template
from vllm_keras_hub.export.tokenizer import export_tokenizer
from vllm_keras_hub.testing.tokenizers import CHAT_TOKENS
from vllm_keras_hub.testing.tokenizers import make_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
_THINK_THEN_CALL = (
    "<think>\nHm.\n</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)

# family: (the vocabulary's vLLM parsers read, what a trained model writes,
# chat template kwargs, the expected (reasoning, content, calls)).
CASES = {
    "qwen": (
        "qwen",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        {},
        (None, None, [("get_weather", {"city": "Paris"})]),
    ),
    "qwen3": ("qwen3", _THINK_THEN_CALL, {}, ("\nHm.\n", None, [("get_weather", {"city": "Paris"})])),
    "qwen3-no-thinking": (
        "qwen3",
        "It is sunny.",
        {"enable_thinking": False},
        (None, "It is sunny.", []),
    ),
    # Qwen3.5's generation prompt opens the think block itself.
    "qwen3_5": (
        "qwen3_5",
        "Hm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Paris\n</parameter>\n</function>\n</tool_call>",
        {},
        ("Hm.\n", None, [("get_weather", {"city": "Paris"})]),
    ),
    "llama3": (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        {},
        (None, None, [("get_weather", {"city": "Paris"})]),
    ),
    # vLLM's qwen3 parser keeps the newline SmolLM3 writes after `</think>`.
    "smollm3": (
        "smollm3",
        "<think>\nHm.\n</think>\nIt is sunny.",
        {},
        ("\nHm.\n", "\nIt is sunny.", []),
    ),
    "gemma4": (
        "gemma4",
        '<|channel>thought\nHm.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}'
        "<tool_call|>",
        {"enable_thinking": True},
        ("Hm.", None, [("get_weather", {"city": "Paris"})]),
    ),
    "gpt_oss": (
        "gpt_oss",
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
        {},
        ("Hm.", None, [("get_weather", {"city": "Paris"})]),
    ),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The exported chat tokenizer of a family, as transformers loads it."""
    from transformers import AutoTokenizer

    made = {}

    def get(family):
        if family not in made:
            folder = tmp_path_factory.mktemp(family)
            keras_tokenizer = make_tokenizer(family, chat=True)
            export_tokenizer(keras_tokenizer, str(folder), add_start_token=False)
            chat_format = chat_templates.chat_format(family)
            if chat_format.response_template is not None:
                add_response_template(str(folder), chat_format.response_template)
            made[family] = (keras_tokenizer, AutoTokenizer.from_pretrained(str(folder)))
        return made[family]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_formats_parsers_read_its_output(tokenizers, case):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    family, output, kwargs, expected = CASES[case]
    keras_tokenizer, tokenizer = tokenizers(family)
    vocabulary = set(keras_tokenizer.get_vocabulary())
    chat_format = chat_templates.chat_format(family, vocabulary)
    parser_cls = ParserManager.get_parser(
        tool_parser_name=chat_format.tool_parser,
        reasoning_parser_name=chat_format.reasoning_parser,
        enable_auto_tools=chat_format.tool_parser is not None,
        tokenizer=tokenizer,
    )
    request = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[TOOL] if chat_format.tool_parser else None,
        chat_template_kwargs=kwargs,
    )
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
    request = parser.adjust_request(request)
    reasoning, content, calls = parser.parse(
        output,
        request,
        enable_auto_tools=chat_format.tool_parser is not None,
        model_output_token_ids=tokenizer.encode(output, add_special_tokens=False),
    )
    calls = [(call.name, json.loads(call.arguments)) for call in calls or []]
    assert (reasoning, content or None, calls) == expected


@pytest.mark.parametrize("family", ["qwen", "qwen3", "qwen3_5", "llama3", "gemma4", "gpt_oss"])
def test_a_tool_conversation_tokenizes_as_the_official_template_renders_it(
    tokenizers, family
):
    """Token for token: vLLM's rendering with our exported tokenizer gives
    the ids of the official template's text in the family's own KerasHub
    tokenizer, every tool and thinking token whole."""
    from transformers.utils.chat_template_utils import render_jinja_template
    from vllm.renderers.hf import safe_apply_chat_template

    from vllm_keras_hub.export.chat_tools_test import CONVERSATION
    from vllm_keras_hub.export.chat_tools_test import TOOL as DOCUMENTED_TOOL
    from vllm_keras_hub.export.chat_tools_test import TOOL_FAMILIES

    keras_tokenizer, tokenizer = tokenizers(family)
    vocabulary = set(keras_tokenizer.get_vocabulary())
    template = chat_templates.chat_format(family, vocabulary).template
    bos = keras_tokenizer.start_token if keras_tokenizer.start_token_id is not None else ""
    served = safe_apply_chat_template(
        None, tokenizer, CONVERSATION, chat_template=template, tools=[DOCUMENTED_TOOL],
        tokenize=False, add_generation_prompt=True, bos_token=bos,
    )  # fmt: skip
    (official,), _ = render_jinja_template(
        conversations=[CONVERSATION],
        tools=[DOCUMENTED_TOOL],
        chat_template=chat_templates.official_template(TOOL_FAMILIES[family][0]),
        add_generation_prompt=True,
        bos_token=bos,
    )
    ids = tokenizer.encode(served, add_special_tokens=False)
    expected = [] if not bos else [keras_tokenizer.start_token_id]
    expected += [int(i) for i in keras_tokenizer.tokenize(official[len(bos) :])]
    assert ids == expected
    specials = (*CHAT_TOKENS.get(family, ()), *getattr(keras_tokenizer, "special_tokens", ()))
    whole = [t for t in specials if t in official]
    assert whole and all(keras_tokenizer.token_to_id(t) in ids for t in whole)


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_a_required_call_follows_the_schema_only_for_a_strict_tool(tokenizers, strict):
    """What vLLM 0.32 asks of a Qwen3 call under `tool_choice="required"`
    (docs/chat.md): the call opens at `<tool_call>`, so the blank line a
    trained Qwen3 writes after `</think>` cannot come first, and the
    arguments are any JSON unless the tool is `strict`. A trained tiny Qwen3
    wrote wrong arguments that way, with vLLM's native Qwen3 as with ours."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    _, tokenizer = tokenizers("qwen3")
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
    if strict:
        tool["function"]["strict"] = True
    parser_cls = ParserManager.get_parser(
        tool_parser_name="hermes",
        reasoning_parser_name="qwen3",
        enable_auto_tools=True,
        tokenizer=tokenizer,
    )
    request = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool],
        tool_choice="required",
    )
    request = parser_cls(tokenizer, request.tools).adjust_request(request)
    tags = json.loads(request.structured_outputs.structural_tag)["format"]["tags"]
    assert {tag["begin"].split("{")[0] for tag in tags} == {"<tool_call>", "<tool_call>\n"}
    assert {json.dumps(tag["content"]["json_schema"]) for tag in tags} == {
        json.dumps(parameters if strict else True)
    }

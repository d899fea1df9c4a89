"""Agentic chat through `vllm-keras-hub serve` and the official `openai` client.

One server per family with a tool format and thinking: Qwen3 (hermes tool
calls, `<think>`) and Gemma 4 (its own call syntax, thought channel). Each
tiny preset's tokenizer has the published vocabulary's tool and thinking
tokens. Qwen3 runs under `vllm-keras-hub serve` with no parser flag, as a
user would start it: `serve` picks the family's parsers. Gemma 4 runs under
plain vLLM (`python -m vllm.entrypoints.openai.api_server`) on the folder
`vllm-keras-hub export` writes, with the flags it prints.

Tiny random weights never choose a tool call, so the tests force the
model's output with vLLM's structured outputs, in the model's own format,
with a logit bias that makes the grammar's token choices the single special
tokens a trained model emits. `enable_in_reasoning` lets the grammar cover
the thinking too. What is checked is the serving path: the template's
rendering, vLLM's parsers on the family's format, streamed and not, tool
choice through vLLM's structural tags, and the Responses API.
"""

import copy
import json
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.testing.server import console_script
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.testing.tokenizers import CHAT_TOKENS
from vllm_keras_hub.testing.user_env import user_env

MODEL = "tiny-agent"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city.",
        "parameters": PARAMETERS,
    },
}
STRICT_TOOL = {"type": "function", "function": {**TOOL["function"], "strict": True}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
REASONING = "Check the weather."
# Enough for each family's forced output, spelled out by a tiny vocabulary.
FORCED_TOKENS = 160

# What a trained model of each family writes to think, then call the tool,
# in its official format, and the stop token it ends that turn with; the
# chat template kwargs that turn thinking on and off.
FAMILIES = {
    "qwen3": dict(
        official="qwen3",
        output=(
            f"<think>\n{REASONING}\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        ),
        end="<|im_end|>",
        thinking={},
        no_thinking={"enable_thinking": False},
    ),
    # GPT-OSS always thinks, in harmony's analysis channel.
    "gpt_oss": dict(
        official="gpt_oss",
        output=(
            f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json"
            '<|message|>{"city": "Paris"}'
        ),
        end="<|call|>",
        thinking={},
        no_thinking={},
    ),
    "gemma4": dict(
        official="gemma4",
        output=(
            f"<|channel>thought\n{REASONING}<channel|>"
            '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        ),
        # The official template writes the result into the model's turn.
        end="<|tool_response>",
        thinking={"enable_thinking": True},
        no_thinking={},
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def preset(shared, family):
    return shared.preset(family, chat=True)


def plain_vllm_command(preset, folder):
    """The plain-vLLM command `vllm-keras-hub export` prints for `preset`."""
    result = subprocess.run(
        [console_script(), "export", f"keras_hub:{preset}", folder],
        capture_output=True, text=True, env=user_env(), check=True,
    )  # fmt: skip
    (line,) = [x for x in result.stdout.splitlines() if "vllm.entrypoints.openai" in x]
    command = shlex.split(line)
    assert "--tool-call-parser" in command and "--reasoning-parser" in command, line
    return [sys.executable, *command[1:]]


@pytest.fixture(scope="module")
def server(preset, family, tmp_path_factory):
    port = free_port()
    flags = [
        "--port", str(port), "--served-model-name", MODEL, "--dtype", "float32",
        "--enforce-eager", "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "enable_in_reasoning": True}),
    ]  # fmt: skip
    if family == "gemma4":
        folder = str(tmp_path_factory.mktemp("export") / "folder")
        command = plain_vllm_command(preset, folder) + flags
        command += ["--kv-cache-memory-bytes", str(1 << 30)]
    else:
        command = serve_command(preset, *flags)
    with running_server(command, port, model_name=MODEL) as (base_url, _):
        yield base_url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(preset):
    from keras_hub.src.tokenizers.tokenizer import Tokenizer

    return Tokenizer.from_preset(preset)


def forced(tokenizer, family):
    """Request fields that make the model write the family's output, with
    its special tokens as single tokens wherever the text has them, then
    its stop token (the grammar's end allows only stop tokens)."""
    spec = FAMILIES[family]
    tokens = [t for t in CHAT_TOKENS[family] if t in spec["output"]] + [spec["end"]]
    bias = {str(tokenizer.token_to_id(t)): 100 for t in tokens}
    return {"structured_outputs": {"regex": re.escape(spec["output"])}, "logit_bias": bias}


def no_whitespace(tokenizer):
    """A logit bias against whitespace-only tokens: JSON's optional
    whitespace would otherwise take a random model's every token."""
    vocabulary = tokenizer.get_vocabulary()
    blanks = [i for i in range(len(vocabulary)) if not tokenizer.detokenize([i]).strip()]
    return {str(i): -100 for i in blanks}


def chat(client, messages, stream=False, **kwargs):
    """`(reasoning, content, [(name, arguments)], finish_reason)` of a chat."""
    response = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, stream=stream, **kwargs
    )
    if not stream:
        choice = response.choices[0]
        message = choice.message
        calls = [
            (call.function.name, json.loads(call.function.arguments))
            for call in message.tool_calls or []
        ]
        reasoning = getattr(message, "reasoning", None) or ""
        return reasoning, message.content or "", calls, choice.finish_reason
    reasoning, content, names, arguments, finish = "", "", [], {}, None
    for chunk in response:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.function.name:
                names.append(call.function.name)
            arguments[call.index] = arguments.get(call.index, "") + (
                call.function.arguments or ""
            )
        finish = chunk.choices[0].finish_reason or finish
    calls = [(name, json.loads(arguments[i])) for i, name in enumerate(names)]
    return reasoning, content, calls, finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_thinking_then_a_tool_call_are_parsed(client, tokenizer, family, stream):
    spec = FAMILIES[family]
    extra = forced(tokenizer, family)
    reasoning, content, calls, finish = chat(
        client, QUESTION, stream=stream, tools=[TOOL], max_tokens=FORCED_TOKENS,
        extra_body={**extra, "chat_template_kwargs": spec["thinking"]},
    )  # fmt: skip
    assert reasoning.strip() == REASONING
    assert content.strip() == ""
    assert calls == [("get_weather", {"city": "Paris"})]
    assert finish == "tool_calls"


def test_the_forced_output_uses_the_special_tokens(client, tokenizer, family):
    spec = FAMILIES[family]
    response = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[TOOL], max_tokens=FORCED_TOKENS, temperature=0,
        extra_body={
            **forced(tokenizer, family),
            "chat_template_kwargs": spec["thinking"],
            "return_token_ids": True,
        },
    )  # fmt: skip
    *ids, end = response.choices[0].token_ids
    assert tokenizer.id_to_token(end) == spec["end"]
    assert response.choices[0].finish_reason == "tool_calls"
    used = {t for t in CHAT_TOKENS[family] if tokenizer.token_to_id(t) in ids}
    assert used == {t for t in CHAT_TOKENS[family] if t in spec["output"]}


def _conversation(family):
    """A system message, the question, the model's call and its result."""
    call = {
        "id": "call12345",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    return [
        {"role": "system", "content": "You are a weather bot."},
        *copy.deepcopy(QUESTION),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call12345", "content": '{"sky": "sunny"}'},
    ]


def _official_prompt(family, tokenizer):
    """The conversation as the official template renders it, tokenized by
    the preset's own KerasHub tokenizer (which reads `<bos>` as text).

    The messages are as vLLM hands them to a template: each tool dumped with
    all its fields, a call's arguments parsed, and a template that loops over
    content parts (Gemma 4's) given the system and user texts as parts, which
    it renders its own way.
    """
    from transformers.utils.chat_template_utils import render_jinja_template
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionToolsParam,
    )
    from vllm.renderers.hf import _detect_content_format

    template = chat_templates.official_template(FAMILIES[family]["official"])
    messages = _conversation(family)
    call = messages[2]["tool_calls"][0]["function"]
    call["arguments"] = json.loads(call["arguments"])
    if _detect_content_format(template, default="openai") == "openai":
        for message in messages[:2]:
            message["content"] = [{"type": "text", "text": message["content"]}]
    (text,), _ = render_jinja_template(
        conversations=[messages],
        tools=[ChatCompletionToolsParam(**TOOL).model_dump()],
        chat_template=template,
        add_generation_prompt=True,
        bos_token="<bos>",
    )
    ids = []
    if text.startswith("<bos>"):
        ids, text = [tokenizer.start_token_id], text[len("<bos>") :]
    return text, ids + [int(i) for i in tokenizer.tokenize(text)]


def _post(server, path, body):
    request = urllib.request.Request(
        f"{server}{path}",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def test_a_tool_result_renders_token_for_token_as_the_official_template(
    server, client, tokenizer, family
):
    text, expected = _official_prompt(family, tokenizer)
    assert "sunny" in text and "get_weather" in text
    served = _post(
        server,
        "/tokenize",
        {"messages": _conversation(family), "tools": [TOOL], "add_generation_prompt": True},
    )
    assert served["tokens"] == expected
    response = client.chat.completions.create(
        model=MODEL, messages=_conversation(family), tools=[TOOL], max_tokens=2
    )
    assert response.usage.prompt_tokens == len(expected)


# What vLLM 0.32 does with a required or named tool choice, per parser:
# hermes constrains the call with a structural tag in the model's format;
# the gemma4 parser sets no constraint (for vLLM's own Gemma 4 too), so a
# trained model's call is parsed and a random one finds none; the hf parser
# (GPT-OSS) answers a 400, as it cannot constrain a response template.
TOOL_CHOICE = {"qwen3": "constrained", "gemma4": "unconstrained", "gpt_oss": "refused"}


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_forces_a_call_where_vllm_can(client, tokenizer, family, tool_choice, stream):
    request = dict(
        stream=stream, tools=[STRICT_TOOL], tool_choice=tool_choice,
        parallel_tool_calls=False, max_tokens=60,
        extra_body={
            "logit_bias": no_whitespace(tokenizer),
            "chat_template_kwargs": FAMILIES[family]["no_thinking"],
        },
    )  # fmt: skip
    if TOOL_CHOICE[family] == "refused":
        with pytest.raises(openai.BadRequestError, match="cannot guarantee"):
            chat(client, QUESTION, **request)
        return
    _, content, calls, _ = chat(client, QUESTION, **request)
    if TOOL_CHOICE[family] == "unconstrained":
        assert calls == [], calls  # Fails once vLLM constrains it: update the docs.
        return
    assert len(calls) == 1, content
    name, arguments = calls[0]
    assert name == "get_weather"
    assert arguments["city"] in ("Paris", "Rome")


def test_the_responses_api_parses_thinking_and_a_tool_call(client, tokenizer, family):
    spec = FAMILIES[family]
    response = client.responses.create(
        model=MODEL, input=QUESTION[0]["content"], max_output_tokens=FORCED_TOKENS,
        temperature=0, tools=[{"type": "function", **TOOL["function"]}],
        extra_body={
            **forced(tokenizer, family),
            "chat_template_kwargs": spec["thinking"],
        },
    )  # fmt: skip
    reasoning = "".join(
        part.text for item in response.output if item.type == "reasoning"
        for part in item.content or []
    )  # fmt: skip
    calls = [
        (item.name, json.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]
    assert reasoning.strip() == REASONING
    assert calls == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "body, cause",
    [
        (
            {"messages": QUESTION, "tools": [TOOL], "tool_choice": {
                "type": "function", "function": {"name": "get_time"}}},
            "does not match any",
        ),
        ({"messages": QUESTION, "tools": []}, "must not be an empty array"),
        (
            {"messages": [*QUESTION, {"role": "observation", "content": "42"}]},
            "Unknown role observation",
        ),
    ],
    ids=["unknown-named-tool", "empty-tools", "unknown-role"],
)  # fmt: skip
def test_bad_tool_input_gets_a_400_and_the_server_keeps_serving(
    server, client, family, body, cause
):
    with pytest.raises(urllib.error.HTTPError) as raised:
        _post(server, "/v1/chat/completions", {"max_tokens": 2, **body})
    assert raised.value.code == 400
    assert cause in raised.value.read().decode()
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert response.choices[0].finish_reason == "length"

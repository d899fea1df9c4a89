"""Agentic chat through `vllm-keras-hub serve` and the official `openai` client.

One server per tool format: Qwen3 and Qwen2.5 (hermes calls, Qwen3's
`<think>`), Qwen3.5 (XML calls, `qwen3_coder`), Llama 3.1 (JSON calls,
`llama3_json`), Gemma 4 (its own call syntax, thought channel) and GPT-OSS
(harmony, `hf`). Each tiny preset's tokenizer has the published vocabulary's
tool and thinking tokens. All but Gemma 4 run under `vllm-keras-hub serve`
with no parser flag, as a user would start it: `serve` picks the family's
parsers. Gemma 4 runs under plain vLLM (`python -m
vllm.entrypoints.openai.api_server`) on the folder `vllm-keras-hub export`
writes, with the flags it prints.

Tiny random weights never choose a tool call, so the tests force the
model's output (`testing/chat_tools.py`): vLLM's structured outputs, in the
model's own format, with a logit bias that makes the grammar's token
choices the single special tokens a trained model emits.
`enable_in_reasoning` lets the grammar cover the thinking too. What is
checked is the serving path: the template's rendering, vLLM's parsers on the
family's format, streamed and not, tool choice through vLLM's structural
tags, and the Responses API.
"""

import json
import shlex
import subprocess
import sys
import urllib.error

import openai
import pytest

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing.chat_tools import FAMILIES
from vllm_keras_hub.testing.chat_tools import FORCED_TOKENS
from vllm_keras_hub.testing.chat_tools import MODEL
from vllm_keras_hub.testing.chat_tools import QUESTION
from vllm_keras_hub.testing.chat_tools import REASONING
from vllm_keras_hub.testing.chat_tools import STRICT_TOOL
from vllm_keras_hub.testing.chat_tools import TEMPLATE_KWARGS
from vllm_keras_hub.testing.chat_tools import TOOL
from vllm_keras_hub.testing.chat_tools import call_tokens_bias
from vllm_keras_hub.testing.chat_tools import chat
from vllm_keras_hub.testing.chat_tools import chat_tokens
from vllm_keras_hub.testing.chat_tools import conversation
from vllm_keras_hub.testing.chat_tools import forced
from vllm_keras_hub.testing.chat_tools import no_whitespace
from vllm_keras_hub.testing.chat_tools import official_prompt
from vllm_keras_hub.testing.chat_tools import post
from vllm_keras_hub.testing.server import console_script
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.testing.user_env import user_env


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def preset(shared, family):
    return shared.preset(FAMILIES[family]["preset"], chat=True)


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


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_thinking_then_a_tool_call_are_parsed(client, tokenizer, family, stream):
    spec = FAMILIES[family]
    extra = forced(tokenizer, family)
    reasoning, content, calls, finish = chat(
        client, QUESTION, stream=stream, tools=[TOOL], max_tokens=FORCED_TOKENS,
        extra_body={**extra, "chat_template_kwargs": spec["thinking"]},
    )  # fmt: skip
    assert reasoning.strip() == (REASONING if spec["thinks"] else "")
    assert content.strip() == ""
    assert calls == [("get_weather", {"city": "Paris"})]
    assert finish == "tool_calls"
    chat_format = chat_templates.chat_format(spec["preset"], tokenizer.get_vocabulary())
    served = f"tools: `{chat_format.tool_parser}`"
    if spec["thinks"]:
        served += f"; thinking: `{chat_format.reasoning_parser}`"
    support_matrix.record_chat(spec["preset"], served, served=True)


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
    used = {t for t in chat_tokens(family) if tokenizer.token_to_id(t) in ids}
    assert used == {t for t in chat_tokens(family) if t in spec["output"]}


def test_a_tool_result_renders_token_for_token_as_the_official_template(
    server, client, tokenizer, family
):
    text, expected = official_prompt(family, tokenizer)
    assert "sunny" in text and "get_weather" in text
    served = post(
        server,
        "/tokenize",
        {
            "messages": conversation(),
            "tools": [TOOL],
            "add_generation_prompt": True,
            "chat_template_kwargs": TEMPLATE_KWARGS,
        },
    )
    assert served["tokens"] == expected
    response = client.chat.completions.create(
        model=MODEL, messages=conversation(), tools=[TOOL], max_tokens=2,
        extra_body={"chat_template_kwargs": TEMPLATE_KWARGS},
    )  # fmt: skip
    assert response.usage.prompt_tokens == len(expected)


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_forces_a_call_where_vllm_can(client, tokenizer, family, tool_choice, stream):
    """What vLLM 0.32 does with a required or named tool choice, per parser
    (`FAMILIES`, docs/chat.md): hermes, qwen3_coder and llama3_json constrain
    the call with a structural tag in the model's format; the gemma4 parser
    sets none; the hf parser (GPT-OSS) answers a 400, as it cannot constrain
    a response template."""
    spec = FAMILIES[family]
    request = dict(
        stream=stream, tools=[STRICT_TOOL], tool_choice=tool_choice,
        parallel_tool_calls=False, max_tokens=80,
        extra_body={
            "logit_bias": {**no_whitespace(tokenizer), **call_tokens_bias(tokenizer, family)},
            "chat_template_kwargs": spec["no_thinking"],
        },
    )  # fmt: skip
    if spec["tool_choice"] == "refused":
        with pytest.raises(openai.BadRequestError, match="cannot guarantee"):
            chat(client, QUESTION, **request)
        return
    if spec["tool_choice"] == "unconstrained" and tool_choice == "required":
        # With no constraint of vLLM's, the request's own structured outputs
        # stand (a structural tag would replace them, and the thinking they
        # force with them), and the parser reads the model's own call.
        request["max_tokens"] = FORCED_TOKENS
        request["extra_body"] = {
            **forced(tokenizer, family), "chat_template_kwargs": spec["thinking"]
        }  # fmt: skip
        reasoning, _, calls, _ = chat(client, QUESTION, **request)
        assert reasoning.strip() == REASONING
        assert calls == [("get_weather", {"city": "Paris"})]
        return
    if spec["tool_choice"] == "unconstrained":
        # vLLM refuses structured outputs beside a named choice, for every
        # parser. Unconstrained, the named choice writes what "auto" writes.
        request["max_tokens"] = 24
        named = chat(client, QUESTION, **request)[:3]
        assert named == chat(client, QUESTION, **{**request, "tool_choice": "auto"})[:3]
        return
    _, content, calls, _ = chat(client, QUESTION, **request)
    # The arguments follow the schema because the tool is `strict`: vLLM
    # constrains only the call around the arguments of a tool without it.
    assert calls in ([("get_weather", {"city": "Paris"})], [("get_weather", {"city": "Rome"})]), (
        content
    )


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
    assert reasoning.strip() == (REASONING if spec["thinks"] else "")
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
        post(server, "/v1/chat/completions", {"max_tokens": 2, **body})
    assert raised.value.code == 400
    assert cause in raised.value.read().decode()
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert response.choices[0].finish_reason == "length"

"""What `tests/chat_tools_server_test.py` asks each tool-calling family, and how.

Tiny random weights never choose a tool call, so the requests force the
model's output with vLLM's structured outputs: a regex of what a trained
model of the family writes, in its official format, with a logit bias that
makes the grammar's token choices the single special tokens a trained model
emits, and its stop token last.
"""

import copy
import json
import re
import urllib.request

from vllm_keras_hub.testing.tokenizers import CHAT_TOKENS

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
# Llama 3.1's template writes today's date unless it is given one.
TEMPLATE_KWARGS = {"date_string": "26 Jul 2024"}
_HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)

# Each family's tiny chat preset (`preset`, a KerasHub family whose tiny
# vocabulary has the published tool and thinking tokens) and official
# template; what a trained model writes to (think, then) call the tool, and
# the stop token it ends that turn with; whether that output thinks; the
# chat template kwargs that turn thinking on and off; and what vLLM 0.32
# makes of a required or named tool choice with the family's tool parser:
# "constrained" (a structural tag in the model's format), "unconstrained"
# (no constraint: the model's own call is parsed) or "refused" (a 400).
FAMILIES = {
    "qwen3": dict(
        preset="qwen3",
        output=f"<think>\n{REASONING}\n</think>\n\n{_HERMES_CALL}",
        end="<|im_end|>",
        thinks=True,
        thinking={},
        no_thinking={"enable_thinking": False},
        tool_choice="constrained",
    ),
    # Qwen2.5 calls tools in the same format, and does not think.
    "qwen2_5": dict(
        preset="qwen",
        output=_HERMES_CALL,
        end="<|im_end|>",
        thinks=False,
        thinking={},
        no_thinking={},
        tool_choice="constrained",
    ),
    # Qwen3.5's generation prompt opens `<think>`; it calls in XML.
    "qwen3_5": dict(
        preset="qwen3_5",
        output=(
            f"{REASONING}\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
        ),
        end="<|im_end|>",
        thinks=True,
        thinking={},
        no_thinking={"enable_thinking": False},
        tool_choice="constrained",
    ),
    # Llama 3.1 (its vocabulary has `<|python_tag|>`) calls a custom tool
    # in JSON, as its model card documents.
    "llama3_1": dict(
        preset="llama3",
        output='{"name": "get_weather", "parameters": {"city": "Paris"}}',
        end="<|eot_id|>",
        thinks=False,
        thinking={},
        no_thinking={},
        tool_choice="constrained",
    ),
    # GPT-OSS always thinks, in harmony's analysis channel.
    "gpt_oss": dict(
        preset="gpt_oss",
        output=(
            f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json"
            '<|message|>{"city": "Paris"}'
        ),
        end="<|call|>",
        thinks=True,
        thinking={},
        no_thinking={},
        tool_choice="refused",
    ),
    "gemma4": dict(
        preset="gemma4",
        output=(
            f"<|channel>thought\n{REASONING}<channel|>"
            '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        ),
        # The official template writes the result into the model's turn.
        end="<|tool_response>",
        thinks=True,
        thinking={"enable_thinking": True},
        no_thinking={},
        tool_choice="unconstrained",
    ),
}


def chat_tokens(family):
    """The tool and thinking tokens of `family`'s tiny chat vocabulary."""
    return CHAT_TOKENS[FAMILIES[family]["preset"]]


def call_tokens_bias(tokenizer, family):
    """A logit bias toward the special tokens of the family's output and its
    stop token, so a grammar's choice between one of them and its spelling
    goes to the token."""
    spec = FAMILIES[family]
    tokens = [t for t in chat_tokens(family) if t in spec["output"]] + [spec["end"]]
    return {str(tokenizer.token_to_id(t)): 100 for t in tokens}


def forced(tokenizer, family):
    """Request fields that make the model write the family's output, then
    its stop token (the grammar's end allows only stop tokens)."""
    spec = FAMILIES[family]
    return {
        "structured_outputs": {"regex": re.escape(spec["output"])},
        "logit_bias": call_tokens_bias(tokenizer, family),
    }


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


def conversation():
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


def official_prompt(family, tokenizer):
    """`conversation()` as the official template renders it, tokenized by
    the preset's own KerasHub tokenizer (which reads `<bos>` as text).

    The messages are as vLLM hands them to a template: each tool dumped with
    all its fields, a call's arguments parsed, and a template that loops over
    content parts (Gemma 4's) given the system and user texts as parts, which
    it renders its own way.

    Args:
        family: A key of `FAMILIES`; its official template is `templates/<family>.jinja`.
        tokenizer: The preset's KerasHub tokenizer.

    Returns:
        `(text, ids)`.
    """
    from transformers.utils.chat_template_utils import render_jinja_template
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionToolsParam,
    )
    from vllm.renderers.hf import _detect_content_format

    from vllm_keras_hub.export.official_templates import official_template

    template = official_template(family)
    messages = conversation()
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
        **TEMPLATE_KWARGS,
    )
    ids = []
    if text.startswith("<bos>"):
        ids, text = [tokenizer.start_token_id], text[len("<bos>") :]
    return text, ids + [int(i) for i in tokenizer.tokenize(text)]


def post(server, path, body):
    """POSTs `body` (with the model's name) to `server` and reads the JSON."""
    request = urllib.request.Request(
        f"{server}{path}",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)

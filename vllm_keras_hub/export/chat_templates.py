"""Chat formats for KerasHub presets, which ship no chat template of their own.

vLLM formats chat requests with a Jinja chat template, rendered by
`transformers` (`bos_token`, `eos_token`, `messages`, `tools`,
`add_generation_prompt`, `raise_exception`, `strftime_now` in a sandbox with
`trim_blocks` and `lstrip_blocks`). A preset that carries its own template (a
`chat_template.jinja` file, or a `chat_template` in a Hugging Face
`tokenizer_config.json`) is served with it; every other preset gets its
family's maintained format from `chat_format()`.

Families whose instruction-tuned checkpoints call tools or reason use the
official template itself, from `templates/` (`official_templates.py` names
where each copy came from and pins it by SHA-256; the Hugging Face Hub is not
reachable here), with the vLLM parsers that read that format's output. The
others keep a text-only format written after their official template
(`written_templates.py`).

vLLM tokenizes a rendered chat prompt with `add_special_tokens=False`, so
each template writes the start token itself where the model expects one, and
its control strings reach the model only as KerasHub's tokenizer splits that
text. Where a control string is not one token with KerasHub's tokenizer, the
template's constant says so. In short:

- Byte-level BPE tokenizers (Llama3, Qwen, SmolLM3) match exactly the strings
  the tokenizer class registers as special, plus any `unsplittable_tokens`
  its preset config lists (`hf://` conversions list every added token, so
  `<tool_call>` and `<think>` too).
- SentencePiece tokenizers (Gemma, Llama 2, Mistral, Mixtral, Phi-3) match
  user-defined pieces of the proto whole. Control pieces (`<bos>`, `<s>`)
  written by a template are read as those tokens by the exported tokenizer
  (KerasHub's own sentencepiece would spell them out as plain text).
"""

import dataclasses

from vllm_keras_hub.export.official_templates import official_template
from vllm_keras_hub.export.written_templates import GEMMA3N_TEMPLATE
from vllm_keras_hub.export.written_templates import GEMMA3_TEMPLATE
from vllm_keras_hub.export.written_templates import GEMMA_TEMPLATE
from vllm_keras_hub.export.written_templates import LLAMA2_TEMPLATE
from vllm_keras_hub.export.written_templates import LLAMA3_TEMPLATE
from vllm_keras_hub.export.written_templates import MISTRAL_TEMPLATE
from vllm_keras_hub.export.written_templates import PALIGEMMA_TEMPLATE
from vllm_keras_hub.export.written_templates import PHI3_TEMPLATE
from vllm_keras_hub.export.written_templates import QWEN_MOE_TEMPLATE

CHAT_TEMPLATE_FILE = "chat_template.jinja"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

NO_CHAT_TEMPLATE_HELP = (
    "Pass a chat template with `--chat-template PATH_OR_STRING` when serving, "
    "or with `chat_template=` to `LLM.chat`."
)


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """A family's chat format.

    Args:
        template: The Jinja chat template, in Hugging Face conventions
            (`messages`, `tools`, `add_generation_prompt`, `bos_token`).
        turn_end_tokens: Token strings that end an assistant turn, to add to
            the stop ids where the vocabulary has them.
        tool_parser: vLLM's `--tool-call-parser` for the format's tool
            calls, or `None` where it has none.
        reasoning_parser: vLLM's `--reasoning-parser` for the format's
            thinking, or `None` where it has none.
        response_template: For vLLM's `hf` parsers: the format's output
            regions, written into `tokenizer_config.json`.
    """

    template: str
    turn_end_tokens: tuple[str, ...]
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    response_template: dict | None = None


_GEMMA = ChatFormat(GEMMA_TEMPLATE, ("<end_of_turn>",))

_MISTRAL = ChatFormat(MISTRAL_TEMPLATE, ("</s>",))
_QWEN3 = ChatFormat(
    official_template("qwen3"), ("<|im_end|>",), tool_parser="hermes", reasoning_parser="qwen3"
)
# Qwen3.5 calls tools in Qwen3-Coder's XML, which vLLM's `qwen3_coder`
# parser reads; it thinks by default (the generation prompt opens `<think>`).
_QWEN3_5 = ChatFormat(
    official_template("qwen3_5"),
    ("<|im_end|>",),
    tool_parser="qwen3_coder",
    reasoning_parser="qwen3",
)

# GPT-OSS answers in harmony: thinking in the analysis channel, tool calls in
# the commentary channel addressed `to=functions.NAME` (before or after the
# channel, both as the official template writes them and as the model card
# documents), the answer in the final channel. vLLM parses harmony with
# `openai_harmony` only for its own `gpt_oss` model type, which needs the
# o200k encoding file by its pinned SHA-256; its `hf` parsers read this
# description of the same regions instead.
GPT_OSS_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<\|start\|>assistant",
    "fields": {
        "thinking": {
            "open_pattern": r"(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>",
            "close": "<|end|>",
            "content": "text",
        },
        "tool_calls": {
            "open_pattern": r"(?:<\|start\|>assistant)?"
            r"(?: to=functions\.(?P<name>[^\s<]+)<\|channel\|>commentary"
            r"|<\|channel\|>commentary to=functions\.(?P<name>[^\s<]+))"
            r"[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>",
            "close": "<|call|>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {
            "open_pattern": r"(?:<\|start\|>assistant)?<\|channel\|>final<\|message\|>",
            "close_pattern": r"<\|return\|>|<\|end\|>",
            "content": "text",
        },
    },
}

# Families not listed have no maintained format: base-only families (GPT-2,
# OPT, ...).
_CHAT_FORMATS = {
    "gemma": _GEMMA,
    "gemma3": ChatFormat(GEMMA3_TEMPLATE, ("<end_of_turn>",)),
    "gemma3n": ChatFormat(GEMMA3N_TEMPLATE, ("<end_of_turn>",)),
    # A tool call's turn ends at `<|tool_response>`, where the caller's
    # result goes (the template writes it there, in the model's own turn).
    "gemma4": ChatFormat(
        official_template("gemma4"),
        ("<turn|>", "<|tool_response>"),
        tool_parser="gemma4",
        reasoning_parser="gemma4",
    ),
    "llama": ChatFormat(LLAMA2_TEMPLATE, ("</s>",)),
    "pali_gemma": ChatFormat(PALIGEMMA_TEMPLATE, ("<eos>",)),
    "llama3": ChatFormat(LLAMA3_TEMPLATE, ("<|eot_id|>",)),
    "mistral": _MISTRAL,
    "mixtral": _MISTRAL,
    "qwen": ChatFormat(official_template("qwen2_5"), ("<|im_end|>",), tool_parser="hermes"),
    "qwen_moe": ChatFormat(QWEN_MOE_TEMPLATE, ("<|im_end|>",)),
    "qwen3": _QWEN3,
    "qwen3_moe": _QWEN3,
    "qwen3_5": _QWEN3_5,
    "qwen3_5_moe": _QWEN3_5,
    # SmolLM3's template renders tools only from its own `xml_tools` kwarg,
    # not the OpenAI `tools` vLLM passes, so no tool parser.
    "smollm3": ChatFormat(official_template("smollm3"), ("<|im_end|>",), reasoning_parser="qwen3"),
    "phi3": ChatFormat(PHI3_TEMPLATE, ("<|end|>",)),
    # A turn ends at `<|return|>`, or at `<|call|>` for a tool call, as
    # gpt-oss's generation config stops.
    "gpt_oss": ChatFormat(
        official_template("gpt_oss"),
        ("<|return|>", "<|call|>"),
        tool_parser="hf",
        reasoning_parser="hf",
        response_template=GPT_OSS_RESPONSE_TEMPLATE,
    ),
}

# Llama 3.1 and later: the vocabulary names `<|python_tag|>` (Llama 3.0's has
# a reserved token there), and the official template renders tools.
_LLAMA3_1 = ChatFormat(
    official_template("llama3_1"), ("<|eot_id|>", "<|eom_id|>"), tool_parser="llama3_json"
)
_LLAMA3_1_MARKER = "<|python_tag|>"
# The tokens that tell a family's later versions apart.
VERSION_MARKERS = frozenset({_LLAMA3_1_MARKER})


def chat_format(family_name, vocabulary=()):
    """Returns the maintained `ChatFormat` of a family, or `None`.

    A preset's own template, from `preset_chat_template()`, takes precedence:
    fine-tunes of a family (e.g. SmolLM2 on Llama3, Vicuna on Llama) chat in
    formats of their own.

    Args:
        family_name: A family key of `families.FAMILIES`, e.g. `"gemma3"`.
        vocabulary: The preset's token strings, which tell a family's
            versions apart (Llama 3.1 from Llama 3).
    """
    if family_name == "llama3" and _LLAMA3_1_MARKER in vocabulary:
        return _LLAMA3_1
    return _CHAT_FORMATS.get(family_name)


def preset_chat_template(preset):
    """Returns the chat template a preset ships, or `None`.

    A `chat_template.jinja` file in the preset comes first, then the
    `chat_template` of a Hugging Face `tokenizer_config.json` (its `"default"`
    entry where it lists named templates).

    Args:
        preset: Anything `keras_hub.models.CausalLM.from_preset` accepts: a
            local folder, or a `kaggle://` or `hf://` handle.
    """
    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    if preset.has(CHAT_TEMPLATE_FILE):
        with open(preset.path(CHAT_TEMPLATE_FILE), encoding="utf-8") as f:
            return f.read() or None
    tokenizer_config = preset.json(HF_TOKENIZER_CONFIG_FILE)
    if tokenizer_config is not None:
        template = tokenizer_config.get("chat_template")
        if isinstance(template, list):
            named = {entry.get("name"): entry.get("template") for entry in template}
            template = named.get("default")
        return template or None
    return None

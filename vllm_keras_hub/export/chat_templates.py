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
others keep a text-only format written after their official template, below.

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
import json

from vllm_keras_hub.export.official_templates import official_template

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


# google/gemma-3-*-it, text only. Gemma 1 and 2 share the turns, but their
# official templates refuse a system message; Gemma 3's folds it into the
# first user turn, as Google advises for all three. `<start_of_turn>` and
# `<end_of_turn>` are user-defined pieces of Gemma's SentencePiece proto, so
# single tokens; `<bos>`, a control piece, is read by the exported tokenizer.
GEMMA_TEMPLATE = r"""{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}"""

# google/gemma-3-*-it with images: as GEMMA_TEMPLATE, and a message whose
# content is a list of parts renders each image part as `<start_of_image>`
# where it stands and each text part trimmed, with nothing between them, as
# the official template does. vLLM then hands the template the parts.
_GEMMA_TURN = (
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<end_of_turn>\\n' }}"
)
assert _GEMMA_TURN in GEMMA_TEMPLATE
# vLLM hands such a template every message's content as parts, the system
# message's too: its text is the first part's, as the official template has it.
_GEMMA_SYSTEM = "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
assert _GEMMA_SYSTEM in GEMMA_TEMPLATE
GEMMA3_TEMPLATE = GEMMA_TEMPLATE.replace(
    _GEMMA_SYSTEM,
    r"""{%- if messages[0]['content'] is string %}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' %}
    {%- else %}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' %}
    {%- endif %}""",
).replace(
    _GEMMA_TURN,
    r"""{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}
    {%- if message['content'] is string %}
        {{- message['content'] | trim }}
    {%- else %}
        {%- for part in message['content'] %}
            {%- if part['type'] == 'image' %}
                {{- '<start_of_image>' }}
            {%- elif part['type'] == 'text' %}
                {{- part['text'] | trim }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<end_of_turn>\n' }}""",
)

# Gemma3n's: Gemma 3's, and an audio part renders as `<start_of_audio>`, the
# placeholder its preprocessor expands (the official template writes the
# soft token, which Hugging Face's processor expands).
_GEMMA3_IMAGE_PART = r"""{%- if part['type'] == 'image' %}
                {{- '<start_of_image>' }}"""
assert _GEMMA3_IMAGE_PART in GEMMA3_TEMPLATE
GEMMA3N_TEMPLATE = GEMMA3_TEMPLATE.replace(
    _GEMMA3_IMAGE_PART,
    _GEMMA3_IMAGE_PART
    + r"""
            {%- elif part['type'] == 'audio' %}
                {{- '<start_of_audio>' }}""",
)

# meta-llama/Meta-Llama-3-8B-Instruct. Llama 3.1 and 3.2 templates also
# write "Cutting Knowledge Date" / "Today Date" lines into the system turn
# and handle tools; the turns are the same. Every control string here is a
# special token of Llama3Tokenizer, so a single token.
LLAMA3_TEMPLATE = r"""{%- for message in messages %}
    {%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}
    {%- if loop.index0 == 0 %}
        {%- set content = bos_token + content %}
    {%- endif %}
    {{- content }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"""

# meta-llama/Llama-2-7b-chat-hf. `[INST]` and `<<SYS>>` are plain text for
# upstream's tokenizer too; `<s>` and `</s>`, control pieces, are read as
# tokens by the exported tokenizer, as upstream's reads them.
LLAMA2_TEMPLATE = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set loop_messages = messages[1:] %}
    {%- set system_message = messages[0]['content'] %}
{%- else %}
    {%- set loop_messages = messages %}
    {%- set system_message = false %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if loop.index0 == 0 and system_message != false %}
        {%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}
    {%- else %}
        {%- set content = message['content'] %}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + content.strip() + ' ' + eos_token }}
    {%- endif %}
{%- endfor %}"""

# Mistral's "v1" template (Mistral-7B-Instruct-v0.1/v0.2,
# Mixtral-8x7B-Instruct-v0.1). `[INST]` is plain text for those tokenizers;
# v0.3's control `[INST]` pieces are plain text for KerasHub either way, and
# so are `<s>` and `</s>` once rendered.
MISTRAL_TEMPLATE = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}"""

# Qwen/Qwen1.5-MoE-A2.7B-Chat (Qwen 1.5's ChatML). QwenMoeTokenizer
# registers only `<|endoftext|>`: `<|im_start|>` and `<|im_end|>` are plain
# text unless the preset lists them in `unsplittable_tokens`.
QWEN_MOE_TEMPLATE = r"""{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

# microsoft/Phi-3-mini-4k-instruct (the template with system turns). Its
# `<|user|>`, `<|assistant|>`, `<|system|>` and `<|end|>` are added tokens
# upstream, not pieces of its `tokenizer.model`: they are single tokens only
# where the preset's proto carries them as user-defined pieces.
PHI3_TEMPLATE = r"""{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- '<|system|>\n' + message['content'] + '<|end|>\n' }}
    {%- elif message['role'] == 'user' %}
        {{- '<|user|>\n' + message['content'] + '<|end|>\n' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '<|assistant|>\n' + message['content'] + '<|end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>\n' }}
{%- else %}
    {{- eos_token }}
{%- endif %}"""

_GEMMA = ChatFormat(GEMMA_TEMPLATE, ("<end_of_turn>",))

# PaliGemma is not a chat model: one prompt, its image first (the processor
# puts it there, so the template writes no placeholder), its text ending in
# the newline PaliGemma's prompts end with (as in "caption en\n").
PALIGEMMA_TEMPLATE = (
    "{%- if messages | length != 1 or messages[0]['role'] != 'user' %}"
    "{{- raise_exception('PaliGemma takes one prompt with its image: send a "
    "single user message.') }}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- set content = messages[0]['content'] %}"
    "{%- if content is string %}{{- content }}"
    "{%- else %}{%- for part in content %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '\\n' }}"
)
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
    from keras_hub.src.utils.preset_utils import check_file_exists
    from keras_hub.src.utils.preset_utils import get_file

    if check_file_exists(preset, CHAT_TEMPLATE_FILE):
        with open(get_file(preset, CHAT_TEMPLATE_FILE), encoding="utf-8") as f:
            return f.read() or None
    if check_file_exists(preset, HF_TOKENIZER_CONFIG_FILE):
        path = get_file(preset, HF_TOKENIZER_CONFIG_FILE)
        with open(path, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        if isinstance(template, list):
            named = {entry.get("name"): entry.get("template") for entry in template}
            template = named.get("default")
        return template or None
    return None

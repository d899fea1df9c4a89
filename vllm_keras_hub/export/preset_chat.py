"""The chat format a preset is served with, and where vLLM's parsers read it.

A preset's own chat template comes first, else its family's maintained
format (`chat_templates.py`); either is put behind a guard that refuses
unknown roles, and a family with neither gets a template that refuses chat
requests, saying how to pass one. A format's `response_template` goes into
the exported `tokenizer_config.json`, for vLLM's `hf` parsers.
"""

import dataclasses
import json
import os

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export import tokenizer as tokenizer_export

# vLLM passes any role through to the template, and most templates render an
# unknown one as if it were valid; refuse it instead (vLLM answers a 400).
ROLE_GUARD = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'developer', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('Unknown role ' ~ message['role'] ~ ': roles are system, "
    "developer, user, assistant and tool.') }}"
    "{%- endif %}{%- endfor %}"
)


def chat_format_of(preset, family, vocabulary):
    """The `ChatFormat` to serve `preset` with.

    The preset's own template first, else the family's maintained format,
    either behind a guard that refuses unknown roles. A preset's own template
    gets the family's parsers where it renders what they read (tools,
    thinking). A family with no chat format gets a template that refuses chat
    requests with a message saying how to pass one (vLLM answers it with a
    400).
    """
    family_format = chat_templates.chat_format(family.name, vocabulary)
    template = chat_templates.preset_chat_template(preset)
    if template is not None:
        parsers = {}
        if family_format is not None:
            if family_format.tool_parser and "tools" in template:
                parsers["tool_parser"] = family_format.tool_parser
            if family_format.reasoning_parser and "think" in template:
                parsers["reasoning_parser"] = family_format.reasoning_parser
        if not parsers:
            return chat_templates.ChatFormat(ROLE_GUARD + template, ())
        # It writes the family's format: its turn ends and output regions too.
        return dataclasses.replace(
            family_format,
            template=ROLE_GUARD + template,
            tool_parser=parsers.get("tool_parser"),
            reasoning_parser=parsers.get("reasoning_parser"),
        )
    if family_format is not None:
        return dataclasses.replace(family_format, template=ROLE_GUARD + family_format.template)
    message = (
        f"{family.display_name} presets have no chat format. "
        f"{chat_templates.NO_CHAT_TEMPLATE_HELP}"
    )
    return chat_templates.ChatFormat("{{ raise_exception(%s) }}" % json.dumps(message), ())


def add_response_template(directory, response_template):
    """Adds a chat format's `response_template` to the exported
    `tokenizer_config.json`, where vLLM's `hf` parsers read it."""
    path = os.path.join(directory, tokenizer_export.TOKENIZER_CONFIG_FILE)
    with open(path) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["response_template"] = response_template
    with open(path, "w") as f:
        json.dump(tokenizer_config, f, indent=2)

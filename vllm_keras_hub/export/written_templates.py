"""Text-only chat formats, written after each family's official template.

The families whose instruction-tuned checkpoints neither call tools nor
reason, and PaliGemma, which takes one prompt, are served with a Jinja
template written here. Each constant's comment names the official template
it follows and says which of its control strings are single tokens with
KerasHub's tokenizer; `chat_templates.py` pairs each with the tokens that
end its turns.
"""

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

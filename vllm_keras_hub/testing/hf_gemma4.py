"""A Gemma4 target and its assistant, random, in Hugging Face's format and
as KerasHub presets of the same weights.

vLLM serves the Hugging Face pair natively (its `Gemma4ForCausalLM` and
`Gemma4MTP`); keras-hub's converters load the same folders into
`Gemma4CausalLM` and `Gemma4AssistantCausalLM` presets. keras-hub 0.32's
converter reads a global layer's head size from `global_head_dim`, which
transformers 5 writes per layer (`per_layer_config`), so it reads a copy
of each folder with that key added.
"""

import json
import os
import shutil

# The tiny Gemma4 of `presets.TINY_FAMILIES["gemma4"]`, without per-layer
# inputs: sliding (head size 32) and full (128) layers, the last two
# reading the first two's KV.
TARGET = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    layer_types=["sliding_attention", "full_attention"] * 2,
    per_layer_config={"01": {"head_dim": 128}, "03": {"head_dim": 128}},
    sliding_window=8,
    hidden_size_per_layer_input=0,
    num_kv_shared_layers=2,
    final_logit_softcapping=None,
    max_position_embeddings=4096,
)
# Its assistant: one block of each kind, reading the target's caches.
ASSISTANT = dict(
    TARGET,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    layer_types=["sliding_attention", "full_attention"],
    per_layer_config={"01": {"head_dim": 128}},
)
# Embedding and layer-kernel factors over transformers' initialisation, so
# the context decides the target's tokens (as the tiny presets scale theirs).
EMBEDDING_SCALE = 3.0
KERNEL_SCALE = 4.0


def _scaled(model):
    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(EMBEDDING_SCALE)
        for weight in model.model.layers.parameters():
            if weight.ndim >= 2:
                weight.mul_(KERNEL_SCALE)
    return model


def save_hf_pair(
    folder, tokenizer_folder, vocabulary_size, seed=0, target=None, assistant=None
):
    """Saves a random Gemma4 target and assistant under `folder`.

    Args:
        folder: Gets `target/` and `assistant/`.
        tokenizer_folder: A model folder whose `tokenizer.json` and
            `tokenizer_config.json` both get (vLLM's tokenizer).
        vocabulary_size: Of both models.
        seed: The weights' seed.
        target: Config values over `TARGET` (a bigger shape).
        assistant: Config values over `ASSISTANT`.

    Returns:
        `(target folder, assistant folder)`.
    """
    import torch
    import transformers

    def text_config(**shape):
        return transformers.Gemma4TextConfig(vocab_size=vocabulary_size, **shape)

    target_shape = {**TARGET, **(target or {})}
    torch.manual_seed(seed)
    target_model = _scaled(
        transformers.Gemma4ForCausalLM(
            text_config(vocab_size_per_layer_input=vocabulary_size, **target_shape)
        )
    )
    torch.manual_seed(seed + 1)
    assistant_shape = {**ASSISTANT, **(assistant or {})}
    assistant_model = _scaled(
        transformers.Gemma4AssistantForCausalLM(
            transformers.Gemma4AssistantConfig(
                text_config=text_config(
                    vocab_size_per_layer_input=0, **assistant_shape
                ).to_dict(),
                backbone_hidden_size=target_shape["hidden_size"],
                use_ordered_embeddings=False,
            )
        )
    )
    paths = []
    for name, model in (("target", target_model), ("assistant", assistant_model)):
        path = os.path.join(folder, name)
        model.save_pretrained(path)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_folder, file), path)
        paths.append(path)
    return tuple(paths)


def _keras_hub_view(hf_folder):
    view = hf_folder.rstrip("/") + "-keras-hub"
    shutil.copytree(hf_folder, view, dirs_exist_ok=True)
    with open(os.path.join(view, "config.json")) as f:
        config = json.load(f)
    text = config.get("text_config", config)
    text["global_head_dim"] = max(
        layer["head_dim"] for layer in text["per_layer_config"].values()
    )
    with open(os.path.join(view, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return view


def keras_hub_pair(hf_target, hf_assistant, folder, tokenizer):
    """The Hugging Face pair as KerasHub presets, by keras-hub's converters.

    Args:
        hf_target: The target folder `save_hf_pair` wrote.
        hf_assistant: Its assistant folder.
        folder: Gets `target/` and `assistant/` presets.
        tokenizer: The KerasHub tokenizer both presets get.

    Returns:
        `(target preset, assistant preset)`.
    """
    import keras_hub

    backbone = keras_hub.models.Backbone.from_preset(_keras_hub_view(hf_target))
    target = keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None)
    assistant = keras_hub.models.Gemma4AssistantCausalLM.from_preset(
        _keras_hub_view(hf_assistant), preprocessor=None
    )
    paths = []
    for name, task in (("target", target), ("assistant", assistant)):
        path = os.path.join(folder, name)
        task.save_to_preset(path)
        tokenizer.save_to_preset(path)
        paths.append(path)
    return tuple(paths)

"""Tiny LoRA fine-tunes, made with KerasHub's own LoRA, for the tests."""

import os

import keras
import keras_hub
import numpy as np


def fine_tune_lora(
    preset, directory, rank=2, steps=8, seed=0, target_layer_names=None
):
    """Fine-tunes `preset` with `backbone.enable_lora(rank)` for a few steps.

    The steps fit random next-token targets with a large learning rate, so
    that B moves far from zero and the adapter changes greedy tokens.
    Keras's own `fit` trains it (KerasHub's `CausalLM.fit` needs Grain or
    TensorFlow to preprocess, so the task runs on token ids).

    Args:
        preset: A tiny preset folder.
        directory: Where to write the results (made if missing).
        rank: The LoRA rank.
        steps: Optimizer steps, of 4 sequences of 16 tokens each.
        seed: Seeds the targets and Keras's initialisers.
        target_layer_names: The layers to put LoRA on (default: KerasHub's
            default, the attention's query and value).

    Returns:
        `(adapter, tuned_preset)`: the `save_lora_weights` file, and the
        `save_to_preset` folder of the fine-tuned model (LoRA merged into its
        kernels by Keras).
    """
    keras.utils.set_random_seed(seed)
    causal_lm = keras_hub.models.CausalLM.from_preset(preset)
    preprocessor, causal_lm.preprocessor = causal_lm.preprocessor, None
    causal_lm.backbone.enable_lora(rank, target_layer_names)
    vocabulary_size = causal_lm.backbone.vocabulary_size
    ids = np.random.default_rng(seed).integers(1, vocabulary_size, (4 * steps, 17))
    inputs = {
        "token_ids": ids[:, :-1].astype("int32"),
        "padding_mask": np.ones((len(ids), 16), bool),
    }
    causal_lm.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    keras.Model.fit(causal_lm, inputs, ids[:, 1:], batch_size=4, epochs=1, verbose=0)
    os.makedirs(directory, exist_ok=True)
    adapter = os.path.join(directory, "tuned.lora.h5")
    causal_lm.backbone.save_lora_weights(adapter)
    causal_lm.preprocessor = preprocessor
    tuned_preset = os.path.join(directory, "tuned_preset")
    causal_lm.save_to_preset(tuned_preset)
    return adapter, tuned_preset


def random_lora(preset, path, rank=2, seed=0, target_layer_names=None):
    """Saves a KerasHub adapter for `preset` with random A and B.

    For families `fine_tune_lora` cannot fit without a preprocessor, such as
    Gemma4 (KerasHub 0.32's `CausalLM.from_preset` picks its assistant
    class). B is drawn like A, so the adapter changes greedy tokens.

    Args:
        preset: A tiny preset folder.
        path: The `.lora.h5` file to write.
        rank: The LoRA rank.
        seed: Seeds A and B.
        target_layer_names: The layers to put LoRA on (default: KerasHub's).

    Returns:
        `path`.
    """
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Backbone.from_preset(preset)
    backbone.enable_lora(rank, target_layer_names)
    rng = np.random.default_rng(seed)
    for layer in backbone._flatten_layers(include_self=False):
        if getattr(layer, "lora_enabled", False):
            shape = layer.lora_kernel_b.shape
            layer.lora_kernel_b.assign(rng.normal(size=shape).astype("float32"))
    backbone.save_lora_weights(path)
    return path

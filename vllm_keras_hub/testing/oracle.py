"""The correctness oracle: a preset's own `CausalLM.generate()`."""

import keras
import keras_hub
import numpy as np

from vllm_keras_hub.export.sampling import causal_lm_class
from vllm_keras_hub.lora import merged as lora


def _pack(preset, prompts, sequence_length):
    """The preset preprocessor's `generate_preprocess`, where it loads.

    Gemma3's preprocessor requires TensorFlow even for text; without it the
    prompt is packed as `generate_preprocess` packs it: the start token (which
    it always prepends when the tokenizer has one), then the prompt's ids.
    """
    try:
        preprocessor = keras_hub.models.CausalLMPreprocessor.from_preset(preset)
    except (ImportError, FileNotFoundError):
        preprocessor = None
    if preprocessor is not None:
        return preprocessor.generate_preprocess(prompts, sequence_length=sequence_length)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    start = [] if tokenizer.start_token_id is None else [tokenizer.start_token_id]
    token_ids = np.zeros((len(prompts), sequence_length), "int32")
    padding_mask = np.zeros((len(prompts), sequence_length), bool)
    for row, prompt in enumerate(prompts):
        ids = start + keras.ops.convert_to_numpy(tokenizer(prompt)).tolist()
        token_ids[row, : len(ids)] = ids
        padding_mask[row, : len(ids)] = True
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def keras_hub_greedy(
    preset,
    prompts,
    max_new_tokens,
    dtype="float32",
    lora_weights=None,
    lora_targets=None,
):
    """Greedy tokens of `CausalLM.generate()` on `prompts`, as token ids.

    The preset's own preprocessor packs the prompts; `generate()`'s decode
    function then runs on the packed ids with no stop tokens, so exactly `max_new_tokens` come out
    of each row, as with vLLM's `ignore_eos=True`.

    Args:
        preset: A preset `CausalLM.from_preset` accepts.
        prompts: Prompt strings.
        max_new_tokens: Tokens to generate per prompt.
        dtype: The model's dtype.
        lora_weights: A `.lora.h5` adapter to load with KerasHub's own
            `backbone.load_lora_weights` (unmerged: its LoRA forward).
        lora_targets: The `target_layer_names` the adapter was trained
            with, if not KerasHub's default: `load_lora_weights` enables
            LoRA on the default layers only, so the layers are enabled
            first, as a KerasHub user must.

    Returns:
        A list of `(prompt_ids, generated_ids)` pairs of int lists.
    """
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    longest = max(len(tokenizer(p)) for p in prompts) + 1
    inputs = _pack(preset, prompts, longest + max_new_tokens)
    causal_lm = causal_lm_class(preset).from_preset(
        preset, dtype=dtype, preprocessor=None
    )
    if lora_targets is not None:
        rank, _ = lora.read_adapter(lora_weights)
        causal_lm.backbone.enable_lora(rank, lora_targets)
    if lora_weights is not None:
        causal_lm.backbone.load_lora_weights(lora_weights)
    causal_lm.compile(sampler="greedy")
    # The function `generate()` runs on each packed batch. Calling it directly
    # skips only generate()'s output normalisation, which fails for Gemma3
    # text-only batches on torch (it concatenates their `images: None`).
    generate_function = causal_lm.make_generate_function()
    outputs = generate_function(
        {key: keras.ops.convert_to_tensor(value) for key, value in inputs.items()},
        stop_token_ids=None,
    )
    token_ids = keras.ops.convert_to_numpy(outputs["token_ids"])
    prompt_mask = keras.ops.convert_to_numpy(inputs["padding_mask"])
    prompt_ids = keras.ops.convert_to_numpy(inputs["token_ids"])
    results = []
    for row in range(len(prompts)):
        length = int(np.sum(prompt_mask[row]))
        results.append(
            (
                prompt_ids[row, :length].tolist(),
                token_ids[row, length : length + max_new_tokens].tolist(),
            )
        )
    return results


def keras_hub_greedy_full_forward(preset, prompts, max_new_tokens, dtype="float32"):
    """Greedy tokens from the preset's full-sequence forward, with no cache.

    Each step runs the whole `CausalLM` on the prompt plus the tokens so far
    and takes the argmax at the last position: what `generate()` would give
    if its cached decode equalled the model's forward. For families whose
    cached decode is wrong in KerasHub (GPT-NeoX), this is the oracle.
    Arguments and return value as `keras_hub_greedy`.
    """
    import torch

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    packed = _pack(preset, prompts, max(len(tokenizer(p)) for p in prompts) + 1)
    causal_lm = causal_lm_class(preset).from_preset(
        preset, dtype=dtype, preprocessor=None
    )
    prompt_mask = keras.ops.convert_to_numpy(packed["padding_mask"])
    prompt_ids = keras.ops.convert_to_numpy(packed["token_ids"])
    input_names = {tensor.name for tensor in keras.tree.flatten(causal_lm.input)}
    results = []
    for row in range(len(prompts)):
        ids = prompt_ids[row, : int(np.sum(prompt_mask[row]))].tolist()
        generated = []
        for _ in range(max_new_tokens):
            token_ids = np.array([ids + generated], "int32")
            inputs = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
            if "position_ids" in input_names:  # Gemma4 takes positions.
                inputs["position_ids"] = np.arange(token_ids.shape[1])[None]
            with torch.inference_mode():
                if "vision_indices" in input_names:
                    # Qwen3.5 with a vision encoder: its graph demands image
                    # inputs, which its backbone's `__call__` adds, empty.
                    backbone = causal_lm.backbone
                    hidden = backbone(
                        {k: torch.as_tensor(v) for k, v in inputs.items()},
                        training=False,
                    )
                    logits = backbone.token_embedding(hidden, reverse=True)
                else:
                    logits = causal_lm(inputs, training=False)
            generated.append(int(np.argmax(keras.ops.convert_to_numpy(logits)[0, -1])))
        results.append((ids, generated))
    return results

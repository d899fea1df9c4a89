"""The correctness oracle of Qwen3.5 with images: its full forward.

`Qwen3_5CausalLMPreprocessor` needs TensorFlow for images, so its steps are
taken here with its own methods and the preset's own parts: the converter
cuts each image into patches, `_tokenize_with_special_tokens` expands each
`<|image_pad|>` to one pad per merged patch, and `_compute_position_ids`
gives the 4-channel M-RoPE positions.

The oracle is `Qwen3_5CausalLM.score()` over the prompt and the tokens so
far, with those positions, at each step, as for Qwen3.5's text
(`model_test.FULL_FORWARD_ORACLE`: its `generate()` runs its recurrent state
over padding). With images, `generate()` would also decode each token at
its index in the sequence (`call_with_cache` without `position_ids`), where
the preprocessor, Hugging Face and vLLM's own Qwen3.5 continue the text
positions after the image.
"""

import types

import keras
import numpy as np

from vllm_keras_hub.testing.image_oracle import image_parts


def _preprocessor(tokenizer, converter, video_converter=None):
    from keras_hub.src.models.qwen3_5.qwen3_5_causal_lm_preprocessor import (
        Qwen3_5CausalLMPreprocessor,
    )

    return Qwen3_5CausalLMPreprocessor(
        tokenizer=tokenizer, image_converter=converter, video_converter=video_converter
    )


def _position_ids(preprocessor, token_ids, grids, video_grids=None):
    """`_compute_position_ids`: NumPy, returned through `tf.constant`, which
    TensorFlow (not installed) would only wrap; the module's `tf` is a
    stand-in for the call."""
    from keras_hub.src.models.qwen3_5 import qwen3_5_causal_lm_preprocessor as module

    tf = module.tf
    module.tf = types.SimpleNamespace(constant=lambda value, dtype=None: np.asarray(value, dtype))
    try:
        return preprocessor._compute_position_ids(token_ids, grids, video_grids)
    finally:
        module.tf = tf


def _video_inputs(preprocessor, text, video):
    """`generate_preprocess`'s steps for a prompt with one video: the
    converter on all its frames, the marker expanded per pair of frames
    with the metadata's timestamps."""
    converter = preprocessor.video_converter
    converted = converter(np.asarray(video.frames, "float32"))
    grid = keras.ops.convert_to_numpy(converted["grid_thw"]).astype("int32").reshape(1, 3)
    # A copy: `_calculate_timestamps` pads the list of indices it is given
    # in place to whole pairs (KerasHub 0.32), the caller's too.
    metadata = dict(video.metadata, frames_indices=list(video.metadata["frames_indices"]))
    text, counts = preprocessor._expand_video_prompt(
        text, [tuple(grid[0])], converter.temporal_patch_size, video_metadata=[metadata]
    )
    ids = preprocessor._tokenize_with_special_tokens(text, [], counts)
    patches = keras.ops.convert_to_numpy(converted["patches"])
    return [int(i) for i in ids], dict(pixel_values=patches, image_grid_thw=grid, video=True)


def prompt_inputs(preprocessor, converter, text, images):
    """A prompt's ids and its images' (or one video's) inputs, as the
    preprocessor makes them."""
    from vllm_keras_hub.testing.videos import Video

    if isinstance(images, Video):
        return _video_inputs(preprocessor, text, images)
    converted = [converter(np.asarray(image.convert("RGB"), "float32")) for image in images]
    grids = np.array(
        [keras.ops.convert_to_numpy(c["grid_thw"]) for c in converted], "int32"
    ).reshape(-1, 3)
    merge = converter.spatial_merge_size
    counts = [int(t * (h // merge) * (w // merge)) for t, h, w in grids]
    ids = preprocessor._tokenize_with_special_tokens(text, counts, [])
    media = {}
    if images:
        media = dict(
            pixel_values=np.concatenate(
                [keras.ops.convert_to_numpy(c["patches"]) for c in converted]
            ),
            image_grid_thw=grids,
        )
    return [int(i) for i in ids], media


def _score_inputs(preprocessor, ids, media, plain_positions=False, prompt_length=None):
    token_ids = np.array([ids], "int32")
    media = dict(media)
    video = media.pop("video", False)
    inputs = dict(token_ids=token_ids, padding_mask=np.ones_like(token_ids), **media)
    grids = media.get("image_grid_thw", np.zeros((0, 3), "int32"))
    if video:
        inputs["position_ids"] = _position_ids(preprocessor, token_ids, None, grids)
    else:
        inputs["position_ids"] = _position_ids(preprocessor, token_ids, grids)
    if plain_positions == "temporal":
        inputs["position_ids"] = inputs["position_ids"][:, [0, 1, 1, 1]]
    elif plain_positions:
        inputs["position_ids"] = np.broadcast_to(np.arange(len(ids)), (1, 4, len(ids)))
    if media:
        # The prompt's pads only: a generated one is text.
        pad = preprocessor.video_token_id if video else preprocessor.image_token_id
        soft = token_ids[0, :prompt_length] == pad
        inputs["vision_indices"] = np.nonzero(soft)[0].astype("int32")
    return inputs


def _last_logits(causal_lm, inputs):
    import torch

    with torch.inference_mode():
        logits = causal_lm.score({k: torch.as_tensor(v) for k, v in inputs.items()})
    return keras.ops.convert_to_numpy(logits)[0, -1]


def qwen3_5_full_forward_with_images(preset, prompts, max_new_tokens, plain_positions=False):
    """Greedy tokens of a Qwen3.5 preset's full forward on prompts with images.

    Args:
        preset: A Qwen3.5 preset with a vision encoder and image converter.
        prompts: `(text, images)` pairs; each image a `<|image_pad|>` in
            the text (between `<|vision_start|>` and `<|vision_end|>`).
            `images` may be one `testing.videos.Video` instead, its
            marker `<|vision_start|><|video_pad|><|vision_end|>`.
        max_new_tokens: Tokens to generate per prompt.
        plain_positions: Not the preprocessor's M-RoPE positions, for a
            test that they matter: `True`, each token at its index in all
            channels; `"temporal"`, the temporal channel in all three (no
            rows or columns in an image).

    Returns:
        A list of `(prompt_ids, generated_ids)` pairs of int lists.
    """
    from vllm_keras_hub.export.video_format import load_video_converter

    causal_lm, tokenizer, converter = image_parts(preset)
    preprocessor = _preprocessor(tokenizer, converter, load_video_converter(preset))
    results = []
    for text, images in prompts:
        ids, media = prompt_inputs(preprocessor, converter, text, images)
        generated = []
        for _ in range(max_new_tokens):
            inputs = _score_inputs(preprocessor, ids + generated, media, plain_positions, len(ids))
            logits = _last_logits(causal_lm, inputs)
            generated.append(int(np.argmax(logits)))
        results.append((ids, generated))
    return results

"""The correctness oracle with images: a preset's own `generate()`.

Gemma3's, Gemma3n's and Gemma4's `CausalLMPreprocessor`s need TensorFlow
for images, so their steps are taken here with the preset's own parts
(tokenizer, `ImageConverter`), as each preprocessor takes them:
- Gemma3 and Gemma3n replace every `<start_of_image>` in the text with
  `\\n\\n<start_of_image>` + one image soft token per embedding +
  `<end_of_image>\\n\\n`; Gemma4 every `<|image|>` with `<|image>` +
  `<|image|>` per embedding + `<image|>`, no newlines;
- the text is tokenized whole, after the start token;
- each image goes through the preset's `ImageConverter`, and the soft
  tokens are marked as the backbone's image inputs expect.
A Gemma4 prompt may take one video instead of images (`testing.videos.Video`,
as `Gemma4CausalLMPreprocessor` takes one per prompt, and images or a video,
not both): its `<|video|>` becomes the preprocessor's own
`_build_video_replacement` of the video's `video_metadata`, and its frames
go through the preset's own `Gemma4VideoConverter`. Audio clips are taken
as the preprocessors take them in `audio_oracle.py`.
"""

import keras
import keras_hub
import numpy as np

from vllm_keras_hub.export.sampling import causal_lm_class
from vllm_keras_hub.testing import audio_oracle


def _expansion(causal_lm, tokenizer, converter):
    backbone = causal_lm.backbone
    name = type(backbone).__name__
    if name == "Gemma4Backbone":
        count = converter.max_soft_tokens
        return tokenizer.image_placeholder, (
            tokenizer.start_of_image_token
            + tokenizer.image_placeholder * count
            + tokenizer.end_of_image_token
        )
    if name == "Gemma3nBackbone":
        count = backbone.vision_soft_tokens_per_image
    else:
        count = backbone.num_vision_tokens_per_image
    return tokenizer.start_of_image_token, (
        f"\n\n{tokenizer.start_of_image_token}"
        + tokenizer.image_placeholder * count
        + f"{tokenizer.end_of_image_token}\n\n"
    )


def _pixels(converter, images):
    """The converter's outputs for each image, as the backbone's image inputs
    of a batch of one: `images` (Gemma3, Gemma3n), or Gemma4's
    `pixel_values` and `pixel_position_ids`."""
    outputs = []
    for image in images:
        pixels = np.asarray(image.convert("RGB"), "float32")
        if isinstance(converter, keras_hub.layers.Gemma4ImageConverter):
            converted = converter(pixels[None])
            outputs.append({k: keras.ops.convert_to_numpy(v)[0] for k, v in converted.items()})
        else:
            outputs.append({"images": keras.ops.convert_to_numpy(converter(pixels))})
    return {key: np.stack([o[key] for o in outputs])[None] for key in outputs[0]}


def _video_inputs(tokenizer, preset, text, video):
    """`text` with its `<|video|>` expanded, and the video's frames as the
    backbone's image inputs, as `Gemma4CausalLMPreprocessor` makes them."""
    import types

    from keras_hub.src.models.gemma4.gemma4_causal_lm_preprocessor import (
        Gemma4CausalLMPreprocessor as Preprocessor,
    )

    from vllm_keras_hub.export.video_format import load_video_converter

    converter = load_video_converter(preset)
    frames = np.asarray(video.frames, "float32")
    assert len(frames) == converter.num_frames, "KerasHub times the frames it is given"
    count = Preprocessor._compute_video_n_tokens(
        types.SimpleNamespace(video_converter=converter), frames
    )
    replacement = Preprocessor._build_video_replacement(
        None, count, video.metadata["frames_indices"], video.metadata["fps"]
    )
    assert text.count(tokenizer.video_placeholder) == 1, "one video per prompt"
    text = text.replace(tokenizer.video_placeholder, replacement)
    converted = converter._process_single_video(frames)
    pixels = {k: keras.ops.convert_to_numpy(v) for k, v in converted.items()}
    return text, pixels


def image_prompt_inputs(
    causal_lm, tokenizer, converter, text, images, max_new_tokens, clips=(), preset=None
):
    """One prompt with images (and audio clips) as the family's
    `CausalLMPreprocessor` prepares it.

    Returns:
        `(prompt_ids, inputs)`: `inputs` for `generate()`'s function, or the
        backbone, with room for `max_new_tokens`.
    """
    from vllm_keras_hub.testing.videos import Video

    video = images if isinstance(images, Video) else None
    if video is not None:
        text, pixels = _video_inputs(tokenizer, preset, text, video)
    placeholder, expansion = _expansion(causal_lm, tokenizer, converter)
    text = text.replace(placeholder, expansion)
    if clips:
        clip_converter = audio_oracle.audio_converter(preset)
        text = audio_oracle.expand_clips(causal_lm, tokenizer, clip_converter, text, clips)
    ids = [tokenizer.start_token_id]
    ids += keras.ops.convert_to_numpy(tokenizer(text)).tolist()
    token_ids = np.zeros((1, len(ids) + max_new_tokens), "int32")
    token_ids[0, : len(ids)] = ids
    padding_mask = np.zeros_like(token_ids, bool)
    padding_mask[0, : len(ids)] = True
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    if images:
        inputs.update(_pixels(converter, images) if video is None else pixels)
        soft = tokenizer.image_placeholder if video is None else tokenizer.video_placeholder
        vision_mask = token_ids == tokenizer.token_to_id(soft)
        inputs["vision_mask"] = vision_mask.astype("int32")
        inputs["vision_indices"] = np.nonzero(vision_mask[0])[0][None].astype("int32")
    elif isinstance(causal_lm.backbone, keras_hub.models.Gemma3Backbone):
        # Gemma3's generate() takes empty image inputs for text.
        size = causal_lm.backbone.image_size
        inputs["images"] = np.zeros((1, 0, size, size, 3), "float32")
        inputs["vision_mask"] = np.zeros_like(token_ids, "int32")
        inputs["vision_indices"] = np.zeros((1, 0), "int32")
    if clips:
        inputs.update(
            audio_oracle.audio_inputs(causal_lm, tokenizer, clip_converter, token_ids, clips)
        )
    return ids, {key: keras.ops.convert_to_tensor(v) for key, v in inputs.items()}


def image_parts(preset):
    """The preset's float32 `CausalLM`, tokenizer and image converter."""
    from vllm_keras_hub.export.image_format import load_image_converter

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    converter = load_image_converter(preset)
    causal_lm = causal_lm_class(preset).from_preset(
        preset, dtype="float32", preprocessor=None
    )
    return causal_lm, tokenizer, converter


def keras_hub_greedy_with_images(preset, prompts, max_new_tokens):
    """Greedy tokens of the preset's `generate()` on prompts with images.

    Each prompt is prepared by `image_prompt_inputs`; `generate()`'s
    function then runs on each prompt alone, in float32, with no stop
    tokens.

    Args:
        preset: A Gemma3, Gemma3n or Gemma4 preset with a vision encoder.
        prompts: `(text, images)` pairs; `images` a list of PIL images. A
            preset with audio also takes `(text, images, clips)`, `clips` a
            list of 16 kHz sample arrays (Gemma4: of one length).
        max_new_tokens: Tokens to generate per prompt.

    Returns:
        A list of `(prompt_ids, generated_ids)` pairs of int lists.
    """
    causal_lm, tokenizer, converter = image_parts(preset)
    causal_lm.compile(sampler="greedy")
    generate_function = causal_lm.make_generate_function()
    results = []
    for text, images, *clips in prompts:
        ids, inputs = image_prompt_inputs(
            causal_lm,
            tokenizer,
            converter,
            text,
            images,
            max_new_tokens,
            clips=clips[0] if clips else (),
            preset=preset,
        )
        outputs = generate_function(inputs, stop_token_ids=None)
        generated = keras.ops.convert_to_numpy(outputs["token_ids"])[0]
        results.append((ids, generated[len(ids) : len(ids) + max_new_tokens].tolist()))
    return results


def gemma4_full_forward_with_images(preset, prompts, max_new_tokens):
    """Greedy tokens of a Gemma4 backbone's full forward on prompts with images.

    Each step runs the backbone's graph on the prompt plus the tokens so
    far, with no cache, and takes the argmax at the last position. This is
    the oracle for `use_vision_bidirectional_attention` presets: their
    graph attends bidirectionally within each image, but `generate()`
    (KerasHub 0.32) prefills through the cache, where the decoder block
    never applies it (`Gemma4TextDecoderBlock._compute_attention_mask`:
    `cache is None`), so it attends causally over the image.

    Arguments and return value as `keras_hub_greedy_with_images`.
    """
    import torch

    causal_lm, tokenizer, converter = image_parts(preset)
    results = []
    for text, images, *clips in prompts:
        ids, inputs = image_prompt_inputs(
            causal_lm, tokenizer, converter, text, images, 0,
            clips=clips[0] if clips else (), preset=preset,
        )  # fmt: skip
        inputs = {k: keras.ops.convert_to_numpy(v) for k, v in inputs.items()}
        if not images:
            patch = 3 * converter.patch_size**2
            inputs.update(
                pixel_values=np.zeros((1, 0, 0, patch), "float32"),
                pixel_position_ids=np.zeros((1, 0, 0, 2), "int32"),
                vision_mask=np.zeros_like(inputs["token_ids"], "int32"),
                vision_indices=np.zeros((1, 0), "int32"),
            )
        encoder = causal_lm.backbone.audio_encoder
        if encoder is not None and "audio_mel" not in inputs:
            inputs.update(
                audio_mel=np.zeros((1, 0, 0, encoder.input_feat_size), "float32"),
                audio_mel_mask=np.zeros((1, 0, 0), "int32"),
                audio_indices=np.zeros((1, 0), "int32"),
                audio_mask=np.zeros_like(inputs["token_ids"], "int32"),
            )
        generated = []
        for _ in range(max_new_tokens):
            length = len(ids) + len(generated)
            step = dict(inputs)
            step["token_ids"] = np.array([ids + generated], "int32")
            step["padding_mask"] = np.ones((1, length), "int32")
            step["position_ids"] = np.arange(length, dtype="int32")[None]
            for mask in ("vision_mask", "audio_mask"):
                if mask in inputs:
                    step[mask] = np.pad(
                        inputs[mask], ((0, 0), (0, len(generated)))
                    ).astype("int32")
            with torch.inference_mode():
                logits = causal_lm(
                    {k: torch.as_tensor(v) for k, v in step.items()}, training=False
                )
            generated.append(int(np.argmax(keras.ops.convert_to_numpy(logits)[0, -1])))
        results.append((ids, generated))
    return results


def pali_gemma_greedy(preset, prompts, max_new_tokens):
    """Greedy tokens of a PaliGemma preset's `generate()`, each prompt alone.

    Its own preprocessor prepares each prompt (the start token, the text,
    the image through its converter). One at a time: in a batch,
    `PaliGemmaCausalLM.generate()` starts decoding at the shortest prompt's
    end and computes the longer prompts' last tokens again causally,
    overwriting their bidirectional keys and values.

    Args:
        preset: A PaliGemma preset, with its preprocessor.
        prompts: `(text, image)` pairs, `image` a PIL image.
        max_new_tokens: Tokens to generate per prompt.

    Returns:
        A list of `(prompt_ids, generated_ids)` pairs of int lists.
    """
    causal_lm = keras_hub.models.PaliGemmaCausalLM.from_preset(preset, dtype="float32")
    causal_lm.compile(sampler="greedy")
    preprocessor = causal_lm.preprocessor
    generate_function = causal_lm.make_generate_function()
    results = []
    for text, image in prompts:
        pixels = np.asarray(image.convert("RGB"), "float32")
        length = len(preprocessor.tokenizer(text)) + 1
        inputs = preprocessor.generate_preprocess(
            {"images": pixels[None], "prompts": [text]},
            sequence_length=length + max_new_tokens,
        )
        outputs = generate_function(inputs, stop_token_ids=None)
        generated = keras.ops.convert_to_numpy(outputs["token_ids"])[0].tolist()
        results.append((generated[:length], generated[length:]))
    return results

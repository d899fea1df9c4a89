"""What a preset served with images needs: its format, and engine settings.

A Gemma3 (`gemma3_4b` and up), Gemma3n or Gemma4 preset with a vision
encoder, an image converter and image tokens is served with images. Its
`config.json` carries the image format as `keras_hub_image`, read by the
processor (`multimodal.py`) and the model class (`vision.py`):
- `placeholder`: what a prompt writes for an image (`<start_of_image>`;
  Gemma4: `<|image|>`);
- `start_token`, `image_token`, `end_token`, `tokens_per_image`, `newlines`:
  what the placeholder expands to, as the family's `CausalLMPreprocessor`
  expands it: `newlines + start + image_token * tokens_per_image + end +
  newlines`;
- `image_size`: the side of the images vLLM profiles the encoder with;
- `bidirectional`: which layers attend bidirectionally within each image
  (`"all"`: Gemma3; `"sliding"`: a Gemma4 preset with
  `use_vision_bidirectional_attention`, its sliding-window layers only;
  `None`: causal, Gemma3n and the other Gemma4 presets; `"prefix"`:
  PaliGemma, every layer over the image and its prompt), and `window`, the
  sliding window.
"""

from vllm_keras_hub import families
from vllm_keras_hub.export import architectures
from vllm_keras_hub.export.hf_config import read_media_format
from vllm_keras_hub.preset import Preset


def preprocessor_part(preset, name):
    """The `name` layer (`"image_converter"`, `"video_converter"`) of the
    preset's `preprocessor.json`, as `CausalLM.from_preset` builds it, or
    `None` where the preset saved no preprocessor or it holds none."""
    import keras

    config = Preset.of(preset).preprocessor_config.get(name)
    return keras.saving.deserialize_keras_object(config) if config else None


def load_image_converter(preset):
    """The preset's image converter, as its preprocessor holds it.

    KerasHub 0.32's `Preprocessor.save_to_preset` saves every sublayer that
    can save itself, and a `VideoConverter` holds a plain `ImageConverter`:
    a preprocessor with both converters (Qwen3.5's) leaves that plain one in
    `image_converter.json`, over its own. So the preprocessor's config,
    which `CausalLM.from_preset` builds from, comes first; then
    `image_converter.json` (a preset saved without a preprocessor).
    """
    from keras_hub.src.layers.preprocessing.image_converter import ImageConverter

    preset = Preset.of(preset)
    converter = preprocessor_part(preset, "image_converter")
    if converter is not None:
        return converter
    if not preset.has("image_converter.json"):
        return None
    return preset.load(ImageConverter)


def image_fields(preset, backbone_class, backbone_config, tokenizer):
    """The `config.json` fields of a preset served with images; `{}` if none.

    A preset with no vision encoder, no image converter or no image tokens
    (a Gemma4 tokenizer built with `has_vision_tokens=False`) serves text.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        backbone_config: Its backbone config.
        tokenizer: Its KerasHub tokenizer.
    """
    architecture = families.family_for_backbone(backbone_class).image_architecture
    if architecture == architectures.PREFIX_LM:
        return _prefix_lm_fields(preset, backbone_config, tokenizer)
    if architecture == architectures.MROPE:
        return _mrope_fields(preset, backbone_config, tokenizer)
    has_encoder = backbone_config.get("vision_encoder") or backbone_config.get(
        "vision_encoder_config"
    )
    if architecture is None or not has_encoder:
        return {}
    if getattr(tokenizer, "image_placeholder_id", -1) in (-1, None):
        return {}
    converter = load_image_converter(preset)
    if converter is None:
        return {}
    image = dict(
        placeholder=tokenizer.start_of_image_token,
        start_token=tokenizer.start_of_image_token,
        image_token=tokenizer.image_placeholder,
        end_token=tokenizer.end_of_image_token,
        newlines="\n\n",
        bidirectional=None,
        window=None,
    )
    if backbone_class == "Gemma3Backbone":
        encoder = backbone_config["vision_encoder"]["config"]
        patches = (encoder["image_size"] // encoder["patch_size"]) ** 2
        image.update(
            tokens_per_image=patches // encoder["pool_size"] ** 2,
            image_size=int(encoder["image_size"]),
            bidirectional="all",
        )
    elif backbone_class == "Gemma3nBackbone":
        # The processor puts the encoder's embeddings at this token.
        image["image_token"] = tokenizer.id_to_token(backbone_config["image_token_id"])
        image.update(
            tokens_per_image=int(backbone_config["vision_soft_tokens_per_image"]),
            image_size=int(backbone_config["vision_encoder_config"]["image_shape"][0]),
        )
    else:
        # Every image's pooled patches, padded by its aspect ratio to the
        # converter's `max_soft_tokens` (KerasHub's preprocessor expands
        # `<|image|>` to `num_vision_tokens_per_image`, by default the same
        # 280), with no newlines.
        image.update(
            placeholder=tokenizer.image_placeholder,
            newlines="",
            tokens_per_image=int(converter.max_soft_tokens),
            image_size=int(backbone_config.get("image_size") or 896),
        )
        if backbone_config.get("use_vision_bidirectional_attention"):
            image.update(
                bidirectional="sliding",
                window=int(backbone_config["sliding_window_size"]),
            )
    return dict(keras_hub_image=image)


def _prefix_lm_fields(preset, backbone_config, tokenizer):
    """PaliGemma: every prompt is one image and its text, the image first.

    `PaliGemmaCausalLM` puts the ViT's embeddings (one per patch) before the
    prompt's and attends over both bidirectionally. The prompt writes no
    placeholder; the image's rows carry the `image_token` (`<image>` where
    the vocabulary has it, else the pad token), never embedded as text.
    """
    if load_image_converter(preset) is None:
        raise ValueError(
            f"Preset '{preset}' is a PaliGemma model without an image "
            "converter (image_converter.json); PaliGemma generates from an "
            "image, so it cannot be served without one."
        )
    vocabulary = set(tokenizer.get_vocabulary())
    image_token = "<image>" if "<image>" in vocabulary else tokenizer.pad_token
    size = int(backbone_config["image_size"])
    window = None
    if backbone_config.get("use_sliding_window_attention"):
        window = int(backbone_config["sliding_window_size"])
    image = dict(
        placeholder=None,
        start_token=None,
        image_token=image_token,
        end_token=None,
        newlines="",
        tokens_per_image=(size // int(backbone_config["vit_patch_size"])) ** 2,
        image_size=size,
        bidirectional="prefix",
        window=window,
    )
    return dict(keras_hub_image=image)


def _mrope_fields(preset, backbone_config, tokenizer):
    """Qwen3.5: `<|image_pad|>` expands to one per merged patch of its image.

    The prompt (its chat template) writes `<|vision_start|><|image_pad|>
    <|vision_end|>`, and `Qwen3_5CausalLMPreprocessor` repeats the pad once
    per soft token, which varies with the image's size. The most an image
    takes is the converter's largest square (`max_pixels`), as vLLM's own
    Qwen3.5 bounds it; M-RoPE positions (`rope_parameters`, which vLLM reads
    to hand the model 3 position rows) place each soft token by its row and
    column.
    """
    import math

    converter = load_image_converter(preset)
    if (
        not backbone_config.get("vision_encoder")
        or converter is None
        or getattr(tokenizer, "image_token_id", None) is None
    ):
        return {}
    side = int(math.isqrt(int(converter.max_pixels)))
    stride = converter.patch_size * converter.spatial_merge_size
    image = dict(
        placeholder=tokenizer.image_token,
        start_token=None,
        image_token=tokenizer.image_token,
        end_token=None,
        newlines="",
        tokens_per_image=(side // stride) ** 2,
        image_size=side,
        bidirectional=None,
        window=None,
    )
    fields = dict(keras_hub_image=image)
    section = backbone_config.get("mrope_section")
    if section:
        fields["rope_parameters"] = dict(
            rope_type="default", mrope_section=list(section), mrope_interleaved=True
        )
    return fields


# Every field above: a folder exported before some of them were written
# is refused with the fix.
FIELDS = (
    "placeholder", "start_token", "image_token", "end_token", "newlines",
    "tokens_per_image", "image_size", "bidirectional", "window",
)  # fmt: skip


def read_image_format(config):
    """The `keras_hub_image` of a model folder's config, checked whole.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    return read_media_format(config, "image", FIELDS)


def needs_whole_images(image):
    """Whether an image's tokens must be computed in one step.

    Where they attend bidirectionally, its first tokens see its last.

    Args:
        image: The preset's `keras_hub_image` config.
    """
    return image.get("bidirectional") is not None

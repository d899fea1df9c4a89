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
  `None`: causal, Gemma3n and the other Gemma4 presets), and `window`, the
  sliding window.
"""

from vllm_keras_hub.export.hf_config import VISION_ARCHITECTURES


def _converter(preset):
    from keras_hub.src.layers.preprocessing.image_converter import ImageConverter
    from keras_hub.src.utils.preset_utils import check_file_exists

    if not check_file_exists(preset, "image_converter.json"):
        return None
    return ImageConverter.from_preset(preset)


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
    architecture = VISION_ARCHITECTURES.get(backbone_class)
    has_encoder = backbone_config.get("vision_encoder") or backbone_config.get(
        "vision_encoder_config"
    )
    if architecture is None or not has_encoder:
        return {}
    if getattr(tokenizer, "image_placeholder_id", -1) in (-1, None):
        return {}
    converter = _converter(preset)
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
    return dict(architectures=[architecture], keras_hub_image=image)


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
    image = config.keras_hub_image
    missing = [field for field in FIELDS if field not in image]
    if missing:
        raise ValueError(
            f"This model folder's image format lacks {missing}: it was "
            "exported by an older vllm-keras-hub. Export it again "
            "(`vllm-keras-hub export`)."
        )
    return image


class UnsupportedImageServingError(ValueError):
    """Engine settings under which images cannot be served exactly."""


def image_limit(limit_mm_per_prompt):
    """The image limit per prompt of vLLM's `limit_mm_per_prompt`, or `None`."""
    limit = (limit_mm_per_prompt or {}).get("image")
    if isinstance(limit, dict):
        limit = limit.get("count")
    return limit


def needs_whole_images(image):
    """Whether an image's tokens must be computed in one step.

    Where they attend bidirectionally, its first tokens see its last.

    Args:
        image: The preset's `keras_hub_image` config.
    """
    return image.get("bidirectional") is not None


def check_image_settings(
    image,
    images_per_prompt,
    chunked_prefill,
    chunked_images,
    pipeline_parallel_size=1,
    scheduler_cls=None,
):
    """Raises for engine settings under which images would not be exact.

    Checked before the engine starts (`KerasHubLLM`, `serve`, which also
    set `disable_chunked_mm_input` and `scheduler_cls` where images attend
    bidirectionally) and again by the model class, for plain `vllm`
    commands.

    Args:
        image: The preset's `keras_hub_image` config.
        images_per_prompt: vLLM's image limit per prompt (0: text only;
            `None`: vLLM's default).
        chunked_prefill: vLLM's `enable_chunked_prefill`.
        chunked_images: Whether vLLM may split an image over two steps
            (`not disable_chunked_mm_input`).
        pipeline_parallel_size: vLLM's `pipeline_parallel_size`.
        scheduler_cls: vLLM's `scheduler_cls`.

    Raises:
        UnsupportedImageServingError: naming the setting and the fix.
    """
    from vllm.platforms import current_platform

    if images_per_prompt == 0:
        return
    text_only = "Serve text only with --limit-mm-per-prompt '{\"image\": 0}'."
    if pipeline_parallel_size and pipeline_parallel_size > 1:
        raise UnsupportedImageServingError(
            f"Images are not served with pipeline parallelism yet. {text_only}"
        )
    if not needs_whole_images(image):
        return
    if image["bidirectional"] == "sliding" and image["tokens_per_image"] > image["window"]:
        # Its mask is (causal and windowed) or within the image; the second
        # attention call computes the window's band, the same only while
        # an image fits in the window.
        raise UnsupportedImageServingError(
            f"This preset attends bidirectionally within each image's "
            f"{image['tokens_per_image']} tokens, more than its sliding window "
            f"of {image['window']}, which vllm-keras-hub does not compute yet. "
            f"{text_only}"
        )
    if not current_platform.is_cpu():
        raise UnsupportedImageServingError(
            "This preset attends bidirectionally within each image, which is "
            "computed with vLLM's CPU attention kernel: its images are served "
            f"on the CPU only so far. {text_only}"
        )
    if chunked_prefill and chunked_images:
        raise UnsupportedImageServingError(
            "This preset attends bidirectionally within each image, so an "
            "image must never be split over two prefill chunks. Serve with "
            "--disable-chunked-mm-input."
        )
    from vllm_keras_hub.scheduler import IMAGE_SCHEDULER
    from vllm_keras_hub.scheduler import ImageScheduler

    if isinstance(scheduler_cls, type):
        holds_images = issubclass(scheduler_cls, ImageScheduler)
    else:
        holds_images = scheduler_cls == IMAGE_SCHEDULER
    if chunked_prefill and not holds_images:
        raise UnsupportedImageServingError(
            "With chunked prefill, vLLM's scheduler can split the rest of an "
            "image a prefix-cache hit cut into over two steps, and the "
            "bidirectional attention within the image would miss its later "
            f"tokens. Serve with --scheduler-cls {IMAGE_SCHEDULER}."
        )

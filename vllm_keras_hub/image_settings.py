"""Engine settings under which a preset's images are served exactly.

Part of `settings.check`: images that attend bidirectionally must each be
computed in one step, and PaliGemma's prompts (image and text, attended
both ways) whole, in one step each.
"""

from vllm_keras_hub.export.image_format import needs_whole_images


class UnsupportedImageServingError(ValueError):
    """Engine settings under which images cannot be served exactly."""


def image_limit(limit_mm_per_prompt):
    """The image limit per prompt of vLLM's `limit_mm_per_prompt`, or `None`."""
    limit = (limit_mm_per_prompt or {}).get("image")
    if isinstance(limit, dict):
        limit = limit.get("count")
    return limit


def check_image_settings(
    image,
    images_per_prompt,
    chunked_prefill,
    chunked_images,
    scheduler_cls=None,
    step_budget=None,
    max_model_len=None,
):
    """Raises for engine settings under which images would not be exact.

    Part of `check`; `settle` first sets `disable_chunked_mm_input` and
    `scheduler_cls` where images attend bidirectionally.

    Args:
        image: The preset's `keras_hub_image` config.
        images_per_prompt: vLLM's image limit per prompt (0: text only;
            `None`: vLLM's default).
        chunked_prefill: vLLM's `enable_chunked_prefill`.
        chunked_images: Whether vLLM may split an image over two steps
            (`not disable_chunked_mm_input`).
        scheduler_cls: vLLM's `scheduler_cls`.
        step_budget: vLLM's `max_num_batched_tokens`, where known.
        max_model_len: vLLM's `max_model_len`, where known.

    Raises:
        UnsupportedImageServingError: naming the setting and the fix.
    """
    from vllm.platforms import current_platform

    prefix = image["bidirectional"] == "prefix"
    if prefix and images_per_prompt == 0:
        raise UnsupportedImageServingError(
            "A PaliGemma preset generates from an image and a prompt, as "
            "KerasHub's PaliGemmaCausalLM does; it is not served text-only "
            "(--limit-mm-per-prompt '{\"image\": 0}')."
        )
    if images_per_prompt == 0:
        return
    text_only = "Serve text only with --limit-mm-per-prompt '{\"image\": 0}'."
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
    if prefix and step_budget and max_model_len and step_budget < max_model_len:
        raise UnsupportedImageServingError(
            "A PaliGemma prompt, its image and text, attends both ways, so it "
            "is computed in one step: the step's token budget must hold the "
            f"longest prompt. Serve with --max-num-batched-tokens "
            f"{max_model_len} (the --max-model-len), not {step_budget}."
        )


def check_prefix_lm_settings(values):
    """Raises for what PaliGemma is not served with yet.

    Args:
        values: vLLM engine arguments by name.
    """
    refused = {
        "enable_lora": "LoRA adapters per request",
        "speculative_config": "speculative decoding",
    }
    for name, what in refused.items():
        if values.get(name) not in (None, False):
            raise UnsupportedImageServingError(
                f"PaliGemma presets are served without {what} so far ({name}): "
                "no test proves them on a prefix LM yet."
            )


def check_embedding_inputs(enable_mm_embeds):
    """Raises where precomputed image, audio or video embeddings are enabled.

    Args:
        enable_mm_embeds: vLLM's `enable_mm_embeds`.
    """
    if enable_mm_embeds:
        raise UnsupportedImageServingError(
            "KerasHub presets take images, audio and video, not precomputed "
            "embeddings of them (--enable-mm-embeds): their placeholders "
            "expand by what the preset's own converters and encoders give, "
            "and vLLM's own Gemma3, Gemma3n and Gemma4 take no such "
            "embeddings either. Serve without --enable-mm-embeds."
        )

"""Engine settings for a KerasHub preset: the defaults we set and the checks.

One sequence for every way in: `serve` and `KerasHubLLM` call `settle`
before the engine starts, and `verify` checks vLLM's own config wherever
vLLM builds one and in each worker, plain `vllm` commands included. A
setting under which the preset would not be served exactly is refused
here, with the reason; the checks of images, parallel layouts and hybrid
state are in `image_settings.py`, `parallel_settings.py` and
`hybrid_settings.py`.
"""

import os

from vllm_keras_hub import families
from vllm_keras_hub import speculative
from vllm_keras_hub import tasks
from vllm_keras_hub.export import architectures
from vllm_keras_hub.export.image_format import needs_whole_images
from vllm_keras_hub.export.image_format import read_image_format
from vllm_keras_hub.hybrid_settings import UnsupportedHybridConfigError  # noqa: F401
from vllm_keras_hub.hybrid_settings import check_hybrid_settings
from vllm_keras_hub.image_settings import UnsupportedImageServingError  # noqa: F401
from vllm_keras_hub.image_settings import check_embedding_inputs
from vllm_keras_hub.image_settings import check_image_settings
from vllm_keras_hub.image_settings import check_prefix_lm_settings
from vllm_keras_hub.image_settings import image_limit
from vllm_keras_hub.lora.adapters import check_lora_serving
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError  # noqa: F401
from vllm_keras_hub.parallel_settings import check_parallelism

# The audio decoder a preset with audio is served with: PyAV, the one the
# lock pins (`--media-io-kwargs`).
AUDIO_MEDIA_IO = {"audio": {"audio_backend": "pyav"}}


def default_media_io(audio, video):
    """The `media_io_kwargs` `serve` sets for a preset's audio and video.

    Args:
        audio: The preset's `keras_hub_audio` config, or `None`.
        video: Its `keras_hub_video` config, or `None`.
    """
    media_io = {}
    if audio:
        # PyAV, the one decoder the lock pins: vLLM's default tries
        # torchcodec and soundfile first and logs an error for every clip.
        media_io.update(AUDIO_MEDIA_IO)
    if video:
        # vLLM's loader keeps as many frames as the converter does (its
        # default is 32, as published), so the converter keeps them all.
        media_io["video"] = {"num_frames": video["num_frames"]}
    return media_io


# vLLM's default `gpu_memory_utilization=0.92` is, on the CPU backend, a share
# of the machine's RAM reserved up front; it fails on any machine already
# running something. A fixed KV cache is what a CPU user wants instead.
CPU_KV_CACHE_BYTES = 2 << 30


def default_kv_cache_bytes(memory_settings_given):
    """The KV-cache size to set, or `None` to leave vLLM's choice.

    Args:
        memory_settings_given: Whether the user set `gpu_memory_utilization`
            or `kv_cache_memory_bytes` themselves.
    """
    from vllm.platforms import current_platform

    if (
        memory_settings_given
        or os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        or not current_platform.is_cpu()
    ):
        return None
    return CPU_KV_CACHE_BYTES


def check(family, image, values):
    """Raises for engine settings this preset cannot be served with exactly.

    Args:
        family: The preset's `families.Family`.
        image: The preset's `keras_hub_image` config, or `None`.
        values: vLLM engine arguments by name (`EngineArgs` fields); a
            missing one counts as unset.
    """
    tensor = values.get("tensor_parallel_size")
    pipeline = values.get("pipeline_parallel_size")
    check_parallelism(
        family, tensor, pipeline, values.get("enable_expert_parallel") or False
    )
    if family.hybrid:
        check_hybrid_settings(
            speculative=values.get("speculative_config") is not None,
            mamba_ssm_cache_dtype=values.get("mamba_ssm_cache_dtype"),
            mamba_cache_dtype=values.get("mamba_cache_dtype"),
            mamba_cache_mode=values.get("mamba_cache_mode"),
            enable_lora=values.get("enable_lora") or False,
            kv_connector=_kv_connector(values.get("kv_transfer_config")),
        )
    if values.get("enable_lora"):
        check_lora_serving(
            tensor,
            values.get("lora_target_modules"),
            values.get("fully_sharded_loras") or False,
        )
    speculative.check(
        values.get("speculative_config"),
        pipeline,
        bool(image),
        family=family,
    )
    if values.get("enable_prompt_embeds"):
        check_prompt_embeds(image, values)
    if image:
        check_embedding_inputs(values.get("enable_mm_embeds"))
    if image and image["bidirectional"] == "prefix":
        check_prefix_lm_settings(values)
    if image:
        check_image_settings(
            image,
            image_limit(values.get("limit_mm_per_prompt")),
            values.get("enable_chunked_prefill") is not False,
            not values.get("disable_chunked_mm_input"),
            values.get("scheduler_cls"),
            values.get("max_num_batched_tokens"),
            values.get("max_model_len"),
        )


def _kv_connector(kv_transfer_config):
    if isinstance(kv_transfer_config, dict):
        return kv_transfer_config.get("kv_connector")
    return getattr(kv_transfer_config, "kv_connector", None)


class UnsupportedPoolingSettingError(ValueError):
    """An engine setting a pooling task (`tasks/`) is not served with."""


class PromptEmbedsError(ValueError):
    """Prompt embeddings (`--enable-prompt-embeds`) where they are not served."""


def check_prompt_embeds(image, values):
    """Raises for settings prompt embeddings are not proven with
    (`models/prompt_embeds.py` checks the backbone as it loads).

    Args:
        image: The preset's `keras_hub_image` config, or `None`.
        values: vLLM engine arguments by name.
    """
    unproven = [
        what
        for what, applies in (
            ("images", bool(image)),
            ("tensor parallelism", (values.get("tensor_parallel_size") or 1) > 1),
            ("pipeline parallelism", (values.get("pipeline_parallel_size") or 1) > 1),
            ("LoRA adapters", bool(values.get("enable_lora"))),
            ("speculative decoding", values.get("speculative_config") is not None),
        )
        if applies
    ]
    if unproven:
        raise PromptEmbedsError(
            "Prompt embeddings (--enable-prompt-embeds) are proven on one worker for "
            f"text presets, not with {' or '.join(unproven)}."
        )


def check_pooling_settings(task, values):
    """Raises for engine settings a pooling or encoder-decoder task is not
    served with.

    Args:
        task: Its KerasHub task class name (a `TextEmbedder`, a
            `Seq2SeqLM`, ...).
        values: vLLM engine arguments by name.
    """
    refused = {
        "tensor_parallel_size": "tensor parallelism",
        "pipeline_parallel_size": "pipeline parallelism",
        "enable_lora": "LoRA adapters per request",
        "speculative_config": "speculative decoding",
        "enable_prompt_embeds": "prompt embeddings",
    }
    for name, what in refused.items():
        value = values.get(name)
        # `True == 1`: `enable_lora=True` must not pass as a size of one.
        if value is None or value is False or (value == 1 and value is not True):
            continue
        raise UnsupportedPoolingSettingError(
            f"{task} presets are served without {what} ({name}={value!r}): "
            "vllm-keras-hub's pooling and encoder-decoder models are proven on "
            "one worker, without adapters or drafts, only."
        )


def settle(folder, values, given):
    """The engine settings to set for `folder`, after checking them all.

    Sets, where the user did not: the `keras_hub` load format, the folder's
    tokenizer mode, whole-image scheduling for images that attend
    bidirectionally (for PaliGemma, a step budget of a whole prompt), PyAV
    to decode audio, and on the CPU a fixed KV cache and (Qwen3.5's images)
    no encoder profile.

    Args:
        folder: The preset's `ModelFolder`.
        values: The user's vLLM engine arguments by name.
        given: The names of the arguments the user set.

    Returns:
        A dict of engine arguments to set.
    """
    from vllm_keras_hub.export.hf_config import LOAD_FORMAT
    from vllm_keras_hub.scheduler import IMAGE_SCHEDULER

    updates = {}
    if values.get("load_format") in (None, "auto"):
        updates["load_format"] = LOAD_FORMAT
    if values.get("tokenizer_mode") in (None, "auto"):
        updates["tokenizer_mode"] = folder.tokenizer_mode
    if folder.images and needs_whole_images(folder.images):
        if "disable_chunked_mm_input" not in given:
            updates["disable_chunked_mm_input"] = True
        if values.get("scheduler_cls") is None:
            updates["scheduler_cls"] = IMAGE_SCHEDULER
    if folder.images and folder.images["bidirectional"] == "prefix":
        # Each PaliGemma prompt is computed in one step.
        if "max_num_batched_tokens" not in given:
            max_model_len = values.get("max_model_len") or folder.max_model_len
            updates["max_num_batched_tokens"] = max_model_len
    if folder.audio_to_text and "max_num_batched_tokens" not in given:
        # vLLM runs a clip's encoder frames in one step, unchunked: the
        # longest clip's must fit a step's budget (the server's default,
        # 2048, holds 49 s).
        updates["max_num_batched_tokens"] = folder.audio_to_text["max_encoder_tokens"]
    if folder.architecture == architectures.MROPE and "skip_mm_profiling" not in given:
        from vllm.platforms import current_platform

        # vLLM's profile run would encode the largest image and video the
        # budgets allow (published Qwen3.5: 4096x4096, 65,536 patches
        # through the ViT's full attention; never run here, too large for
        # these machines), which measures nothing the CPU uses (its KV
        # cache is set, and the encoder is not compiled).
        if current_platform.is_cpu():
            updates["skip_mm_profiling"] = True
    media_io = dict(values.get("media_io_kwargs") or {})
    defaults = default_media_io(folder.audio, folder.video)
    if set(defaults) - set(media_io):
        updates["media_io_kwargs"] = {**defaults, **media_io}
    kv_cache_bytes = default_kv_cache_bytes(
        {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(given)
    )
    if kv_cache_bytes is not None:
        updates["kv_cache_memory_bytes"] = kv_cache_bytes
    if folder.pooling:
        check_pooling_settings(folder.pooling["task"], {**values, **updates})
        return updates
    if folder.family.encoder_decoder:
        check_pooling_settings(folder.family.encoder_decoder, {**values, **updates})
        return updates
    check(folder.family, folder.images, {**values, **updates})
    return updates


def chat_parser_flags(folder, values):
    """The parser settings `vllm serve` needs for the folder's chat format.

    Server flags, not engine arguments: `serve` sets them, `KerasHubLLM`
    (whose `chat()` parses nothing) does not.

    Tool calls are parsed (`--enable-auto-tool-choice --tool-call-parser`)
    unless the user chose a tool parser or parser plugin; thinking is split
    off (`--reasoning-parser`) unless the user chose a reasoning parser.

    Args:
        folder: The preset's `ModelFolder`.
        values: The user's vLLM arguments by name.
    """
    updates = {}
    if folder.tool_parser and not (
        values.get("tool_call_parser") or values.get("tool_parser_plugin")
    ):
        updates["enable_auto_tool_choice"] = True
        updates["tool_call_parser"] = folder.tool_parser
    if folder.reasoning_parser and not (
        values.get("reasoning_parser") or values.get("reasoning_parser_plugin")
    ):
        updates["reasoning_parser"] = folder.reasoning_parser
    return updates


def verify(vllm_config):
    """Raises for the engine's settings where its KerasHub model folder
    cannot be served exactly: `check`, and `check_pooling_settings` for
    a pooling task, on vLLM's own config.

    vLLM calls it as it builds the config (`entrypoints/verify.py`), in the
    front end of every way in, plain `vllm` commands included; the model
    class calls it again in each worker, on the config it was given.
    """
    hf_config = vllm_config.model_config.hf_config
    values = engine_values(vllm_config)
    family = families.family_by_name(hf_config.keras_hub_family)
    check(family, read_image_format(hf_config), values)
    _, pooling = tasks.of_config(hf_config)
    if pooling is not None:
        check_pooling_settings(pooling["task"], values)
    if family.encoder_decoder:
        check_pooling_settings(family.encoder_decoder, values)


def engine_values(vllm_config):
    """The engine arguments `check` reads, from a running engine's config."""
    parallel = vllm_config.parallel_config
    cache = vllm_config.cache_config
    scheduler = vllm_config.scheduler_config
    multimodal = vllm_config.model_config.multimodal_config
    return {
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "enable_expert_parallel": parallel.enable_expert_parallel,
        "speculative_config": vllm_config.speculative_config,
        "kv_transfer_config": vllm_config.kv_transfer_config,
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
        "mamba_cache_dtype": cache.mamba_cache_dtype,
        "mamba_cache_mode": cache.mamba_cache_mode,
        "enable_lora": vllm_config.lora_config is not None,
        "enable_prompt_embeds": vllm_config.model_config.enable_prompt_embeds,
        "fully_sharded_loras": bool(
            vllm_config.lora_config and vllm_config.lora_config.fully_sharded_loras
        ),
        "limit_mm_per_prompt": multimodal and {
            "image": multimodal.get_limit_per_prompt("image")
        },
        # A KV or EC consumer's is vLLM's own (it is sent embeddings' metadata
        # by definition), not the user's.
        "enable_mm_embeds": bool(
            multimodal
            and multimodal.enable_mm_embeds
            and not multimodal.allow_missing_mm_embeddings
        ),
        "enable_chunked_prefill": scheduler.enable_chunked_prefill,
        "disable_chunked_mm_input": scheduler.disable_chunked_mm_input,
        "scheduler_cls": scheduler.scheduler_cls,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_model_len": vllm_config.model_config.max_model_len,
    }

"""Turns a KerasHub preset into a model folder vLLM can open. No weights.

The folder holds `config.json` (our model type, the real dims vLLM sizes the
KV cache from, and the preset reference), the preset's tokenizer exported to
Hugging Face `tokenizers` format, its chat template, and
`generation_config.json` with the stop ids and the preset's default sampler. Weights are read from the
preset itself by the `keras_hub` load format.
"""

import json
import logging
import os

from vllm_keras_hub import families
from vllm_keras_hub import tasks
from vllm_keras_hub.export import architectures
from vllm_keras_hub.export import audio_format
from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export import checkpoint_tokenizer
from vllm_keras_hub.export import drafter as drafter_lib
from vllm_keras_hub.export import hf_config as config_lib
from vllm_keras_hub.export import image_format as image_config
from vllm_keras_hub.export import sampling
from vllm_keras_hub.export import tokenizer as tokenizer_export
from vllm_keras_hub.export import video_format
from vllm_keras_hub.export.backbone_fields import config_digest
from vllm_keras_hub.export.backbone_fields import model_dims
from vllm_keras_hub.export.backbone_fields import vocab_size
from vllm_keras_hub.export.backbone_fields import weights_dtype
from vllm_keras_hub.export.preset_chat import add_response_template
from vllm_keras_hub.export.preset_chat import chat_format_of
from vllm_keras_hub.export.tokenizer_backends import TokenizerExportError
from vllm_keras_hub.preset import Preset
from vllm_keras_hub.preset import PresetError
from vllm_keras_hub.tasks.audio_to_text import spec as audio_to_text_spec
from vllm_keras_hub.tasks.seq_2_seq_lm import spec as seq2seq_spec

logger = logging.getLogger(__name__)

PRESET_PREFIX = "keras_hub:"


def strip_prefix(model):
    """Returns the preset of a `keras_hub:<preset>` string, else `None`."""
    if isinstance(model, str) and model.startswith(PRESET_PREFIX):
        return model[len(PRESET_PREFIX) :]
    return None


def resolve_preset(preset):
    """Normalises a preset reference; local folders become absolute paths.

    vLLM's engine processes may run in another working directory.
    """
    if os.path.isdir(os.path.expanduser(preset)):
        return os.path.abspath(os.path.expanduser(preset))
    return preset


def read_preset(preset):
    """Reads what serving needs from a preset, without building the model.

    Args:
        preset: A `Preset`, or anything `keras_hub.models.CausalLM.from_preset`
            accepts.

    Returns:
        `(family, backbone_config, causal_lm_class)`; no class for an
        encoder family.

    Raises:
        PresetError: the preset is missing or unreadable, naming the cause.
        families.UnsupportedFamilyError: the family has no route.
    """
    preset = Preset.of(preset)
    if preset.converter is not None:  # A Hugging Face checkpoint (hf://).
        backbone_config = preset.converter.convert_backbone_config(preset.config)
    else:
        backbone_config = preset.config["config"]
    family = families.family_for_backbone(preset.backbone_cls.__name__, preset)
    if family.embedder_only or family.encoder_decoder:  # Not served by a CausalLM.
        return family, backbone_config, None
    return family, backbone_config, sampling.causal_lm_class(preset)


def stop_token_ids(tokenizer, stop_tokens):
    """The ids generation stops on.

    `end_token_id`, then `end_token2_id` where the tokenizer has one (Llama3's
    `<|eot_id|>`), as `CausalLM.generate()` stops; then those of
    `stop_tokens` that are in the vocabulary (Gemma3's `<end_of_turn>`, chat
    formats' turn ends).
    """
    ids = [tokenizer.end_token_id]
    if getattr(tokenizer, "end_token2_id", None) is not None:
        ids.append(tokenizer.end_token2_id)
    vocabulary = set(tokenizer.get_vocabulary())
    ids += [tokenizer.token_to_id(token) for token in stop_tokens if token in vocabulary]
    return [int(i) for i in dict.fromkeys(ids) if i is not None]


def adds_start_token(preset, tokenizer):
    """Whether prompts start with the start token, as the preprocessor says."""
    # True is CausalLMPreprocessor's default.
    add_start_token = Preset.of(preset).preprocessor_config.get("add_start_token", True)
    return bool(add_start_token) and tokenizer.start_token_id is not None


def read_tokenizers(preset, backbone_config, causal_lm_cls=None):
    """keras-hub's tokenizer of `preset`, and a checkpoint's own, if it has one.

    Args:
        preset: A preset reference.
        backbone_config: Its backbone config.
        causal_lm_cls: Its `CausalLM` (or other generating task) class,
            if it generates.

    Returns:
        `(tokenizer, checkpoint)`: the KerasHub tokenizer, and the
        `tokenizers.Tokenizer` to serve instead, or `None`
        (`checkpoint_tokenizer.read_checkpoint_tokenizer`).

    Raises:
        PresetError: either cannot be read, naming the preset and the cause.
    """
    from keras_hub.src.tokenizers.tokenizer import Tokenizer

    # KerasHub bug: `Tokenizer.from_preset` of a checkpoint picks the first
    # tokenizer class of its backbone in a `set`'s order (`find_subclass`),
    # which changes from process to process: a Mistral checkpoint got
    # `MistralTekkenTokenizer` (no vocabulary) as often as `MistralTokenizer`.
    # The preprocessor's own tokenizer class is the one its task loads.
    preprocessor_cls = getattr(causal_lm_cls, "preprocessor_cls", None)
    tokenizer_cls = getattr(preprocessor_cls, "tokenizer_cls", None) or Tokenizer
    preset = Preset.of(preset)
    # KerasHub bug: `MoonshineTokenizer` keeps `LlamaTokenizer`'s backbone
    # class, so no tokenizer class is found for a Moonshine backbone; the
    # preprocessor's own class is loaded as it is.
    exact = tokenizer_cls.backbone_cls not in (None, preset.backbone_cls)
    try:
        tokenizer = preset.load(tokenizer_cls, exact=exact)
    except Exception as e:  # noqa: BLE001 - re-raised with the preset named
        # e.g. a checkpoint folder without the vocab.txt keras-hub's BERT
        # converter reads (FileNotFoundError).
        raise PresetError(
            f"Cannot read the tokenizer of KerasHub preset '{preset}': "
            f"{type(e).__name__}: {e}"
        ) from e
    vocabulary_size = vocab_size(backbone_config)
    try:
        checkpoint = checkpoint_tokenizer.read_checkpoint_tokenizer(
            preset, tokenizer, vocabulary_size
        )
    except checkpoint_tokenizer.CheckpointTokenizerError as e:
        raise PresetError(f"Cannot serve the tokenizer of '{preset}': {e}") from e
    return tokenizer, checkpoint


def write_model_folder(preset, directory, max_model_len=None):
    """Writes the vLLM model folder of `preset` into `directory`.

    Args:
        preset: Anything `keras_hub.models.CausalLM.from_preset` accepts.
        directory: An existing, empty folder.
        max_model_len: Written as `max_position_embeddings` when given, so
            vLLM accepts contexts up to it.

    Returns:
        The tokenizer mode vLLM must use: `"auto"` for the exported
        tokenizer, `"keras_hub_torch"` where only KerasHub's own tokenizer is exact
        (for PaliGemma, their image-first modes).
    """
    config_lib.register_config()
    preset = Preset(resolve_preset(preset))
    family, backbone_config, causal_lm_cls = read_preset(preset)
    if family.audio_to_text:
        # Its task names its tokenizer class (`read_tokenizers`).
        causal_lm_cls = audio_to_text_spec.audio_to_text_class(family)
    tokenizer, checkpoint = read_tokenizers(preset, backbone_config, causal_lm_cls)
    if family.encoder_decoder:
        spec, mode = (
            (seq2seq_spec, config_lib.SEQ2SEQ_TOKENIZER_MODE)
            if family.seq2seq
            else (audio_to_text_spec, config_lib.AUDIO_TO_TEXT_TOKENIZER_MODE)
        )
        return _write_encoder_decoder_folder(
            spec, mode, preset, directory, family, backbone_config, tokenizer, max_model_len
        )
    task, spec = tasks.read(preset, family, backbone_config)
    if spec is None and family.embedder_only:
        raise tasks.PoolingTaskError(
            f"Preset '{preset}' is a {family.display_name} model of no task "
            f"served for it; {family.display_name} is served only as one of "
            f"these: {', '.join(task.name for task in tasks.POOLING_TASKS)}."
        )
    if spec is not None:
        return _write_pooling_folder(
            preset,
            directory,
            family,
            backbone_config,
            tokenizer,
            task,
            spec,
            max_model_len,
            checkpoint=checkpoint,
        )

    dims = model_dims(backbone_config)
    if max_model_len is not None:
        dims["max_position_embeddings"] = int(max_model_len)
    chat_format = chat_format_of(preset, family, set(tokenizer.get_vocabulary()))
    stop_ids = stop_token_ids(tokenizer, family.stop_tokens + chat_format.turn_end_tokens)
    images = image_config.image_fields(preset, family.backbone, backbone_config, tokenizer)
    hybrid = config_lib.hybrid_fields(backbone_config)
    architecture = architectures.choose(family, images=bool(images), hybrid=bool(hybrid))
    model_config = config_lib.KerasHubConfig(
        keras_hub_preset=preset.reference,
        keras_hub_family=family.name,
        keras_hub_config_digest=config_digest(backbone_config),
        eos_token_id=stop_ids[0],
        bos_token_id=tokenizer.start_token_id,
        pad_token_id=getattr(tokenizer, "pad_token_id", None),
        torch_dtype=weights_dtype(backbone_config),
        keras_hub_tool_parser=chat_format.tool_parser,
        keras_hub_reasoning_parser=chat_format.reasoning_parser,
        **{
            "architectures": [architecture],
            **dims,
            **hybrid,
            **images,
            **audio_format.audio_fields(
                preset, family.backbone, backbone_config, tokenizer, bool(images)
            ),
            **video_format.video_fields(preset, family.backbone, tokenizer, bool(images)),
            **drafter_lib.drafter_fields(preset),
        },
    )
    model_config.save_pretrained(directory)

    sampler = sampling.default_sampler(causal_lm_cls)
    generation_config = {"eos_token_id": stop_ids}
    if tokenizer.start_token_id is not None:
        generation_config["bos_token_id"] = int(tokenizer.start_token_id)
    generation_config.update(sampling.generation_config_fields(sampler))
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(generation_config, f, indent=2)

    # transformers' tokenizers (so vLLM) read this file beside tokenizer.json.
    with open(os.path.join(directory, chat_templates.CHAT_TEMPLATE_FILE), "w") as f:
        f.write(chat_format.template)
    mode = _write_tokenizer(
        preset,
        tokenizer,
        directory,
        add_start_token=adds_start_token(preset, tokenizer),
        checkpoint=checkpoint,
    )
    if chat_format.response_template is not None:
        add_response_template(directory, chat_format.response_template)
    if images.get("keras_hub_image", {}).get("bidirectional") == "prefix":
        return config_lib.IMAGE_FIRST_TOKENIZER_MODES[mode]
    return mode


def _write_encoder_decoder_folder(spec, mode, preset, directory, family, backbone_config,
                                  tokenizer, max_model_len):  # fmt: skip
    """`write_model_folder` for an encoder-decoder task, its `spec` module
    (`tasks/seq_2_seq_lm/spec.py`, `tasks/audio_to_text/spec.py`); returns
    its tokenizer mode `mode`."""
    fields = spec.config_fields(preset, family, backbone_config, tokenizer, max_model_len)
    config_lib.KerasHubConfig(
        keras_hub_preset=preset.reference,
        keras_hub_family=family.name,
        keras_hub_config_digest=config_digest(backbone_config),
        torch_dtype=weights_dtype(backbone_config),
        **fields,
    ).save_pretrained(directory)
    spec.write_generation_config(family, tokenizer, fields, directory)
    # Decoder prompts and a request's prompt text start with the start token,
    # as the preprocessors pack them (after BART's decoder start). KerasHub's
    # own tokenizer, exported, even for a checkpoint that has its own
    # `tokenizer.json`: BART's wraps every text in `<s> ... </s>`, which
    # would end each decoder prompt with `</s>`.
    if _write_tokenizer(preset, tokenizer, directory, add_start_token=True) != "auto":
        raise PresetError(
            f"Cannot serve '{preset}': its {family.display_name} tokenizer cannot be "
            "exported exactly, and an encoder-decoder preset is served with its "
            "exported tokenizer only."
        )
    return mode


def _write_pooling_folder(
    preset, directory, family, backbone_config, tokenizer, task, spec, max_model_len, checkpoint
):
    """`write_model_folder` for a pooling task (`tasks/`): no chat or sampling files.

    Its prompts are tokenized as its preprocessor packs them: the start
    token where it packs one (`spec.start_token`), the end token after; a
    checkpoint's by its own tokenizer. The longest text is the least of the
    backbone's, the task's own limits (`spec.length_limits`) and a
    checkpoint's `max_seq_length`.
    """
    dims = model_dims(backbone_config)
    if max_model_len is not None:
        dims["max_position_embeddings"] = int(max_model_len)
    sentence_config = checkpoint_tokenizer.sentence_transformers_config(preset)
    for limit, reason in spec.length_limits(sentence_config):
        if max_model_len is not None and int(max_model_len) > limit:
            raise tasks.PoolingTaskError(
                f"Cannot serve '{preset}' with max_model_len={max_model_len}: {reason}."
            )
        dims["max_position_embeddings"] = min(dims["max_position_embeddings"], limit)
    model_config = config_lib.KerasHubConfig(
        keras_hub_preset=preset.reference,
        keras_hub_family=family.name,
        keras_hub_config_digest=config_digest(backbone_config),
        pad_token_id=getattr(tokenizer, "pad_token_id", None),
        torch_dtype=weights_dtype(backbone_config),
        **{**dims, **spec.config_fields()},
    )
    model_config.save_pretrained(directory)
    spec.write_files(directory)
    if sentence_config is not None:
        checkpoint_tokenizer.write_sentence_transformers_config(
            sentence_config, dims["max_position_embeddings"], directory
        )
    # vLLM renders `messages` sent to pooling endpoints with the chat template.
    message = (
        f"{spec.task} takes texts and has no chat format: send them as "
        f"`input` to {task.endpoint}."
    )
    with open(os.path.join(directory, chat_templates.CHAT_TEMPLATE_FILE), "w") as f:
        f.write("{{ raise_exception(%s) }}" % json.dumps(message))
    return _write_tokenizer(
        preset,
        tokenizer,
        directory,
        add_start_token=spec.start_token,
        add_end_token=True,
        checkpoint=checkpoint,
    )


def _write_tokenizer(
    preset, tokenizer, directory, add_start_token, add_end_token=False, checkpoint=None
):
    """Exports the tokenizer; returns the tokenizer mode vLLM must use.

    A checkpoint's own tokenizer (`checkpoint`) is written as it is.
    """
    if checkpoint is not None:
        checkpoint_tokenizer.write_checkpoint_tokenizer(preset, checkpoint, tokenizer, directory)
        return "auto"
    try:
        tokenizer_export.export_tokenizer(
            tokenizer,
            directory,
            add_start_token=add_start_token,
            add_end_token=add_end_token,
        )
        return "auto"
    except TokenizerExportError as e:
        mode = config_lib.KERAS_HUB_TOKENIZER_MODE
        if add_end_token:  # A pooling task's, which also appends the end token.
            mode = config_lib.KERAS_HUB_EMBEDDER_TOKENIZER_MODE
        logger.warning(
            "Serving KerasHub's own tokenizer for '%s' (tokenizer_mode=%r): "
            "it cannot be exported exactly (%s).",
            preset,
            mode,
            e,
        )
        return mode

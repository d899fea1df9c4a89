"""Speculative decoding for KerasHub targets, with KerasHub presets as drafts.

vLLM's `draft_model` method runs a smaller generative model of the target's
vocabulary as the drafter, in the target's worker, with its own paged KV
cache; the target verifies every drafted token, so greedy output is the
target's own. A KerasHub preset drafts as `keras_hub:<preset>`: `settle`
writes its model folder and points the speculative config at it, and vLLM
builds our model class for it under the `draft_model` prefix.

What vLLM 0.32 does that decides the rest:
- `DraftModelProposer._get_model` calls `get_model` without a load config,
  so a draft loads with the target's (`load_format` and
  `model_loader_extra_config`), never `draft_load_config`. A KerasHub
  target's draft is therefore a KerasHub preset too, and a merged adapter
  would reach the draft as well.
- `verify_equal_vocab_size_if_draft_model` compares vocabulary sizes only;
  a draft whose tokens mean other things would pass and draft nothing
  useful. `settle` compares the vocabularies themselves.
- `validate_same_kv_cache_group` needs every draft attention layer in one
  KV cache group: a draft mixing sliding-window and full layers runs only
  with the hybrid KV cache manager off (which then keeps whole-sequence KV
  for sliding layers), and one whose layers share KV (Gemma3n, Gemma4)
  does not run at all. `check_draft_attention` says so at load.
- EAGLE, EAGLE-3, MTP and the other model-based methods read the target's
  hidden states and `model.embed_tokens`; our model class hands drafters
  neither, so they are refused here rather than failing inside the worker.
"""

import json
import os

from vllm_keras_hub.export.preset_folder import strip_prefix

# The module prefix vLLM builds a `draft_model` drafter under.
DRAFT_PREFIX = "draft_model"
# Methods a KerasHub target is served with: ones that need nothing of the
# target but its tokens (and, for `custom_class`, whatever the user's class
# reads, which is theirs to check).
SERVED_METHODS = ("draft_model", "ngram", "ngram_gpu", "suffix", "custom_class")
_NGRAM_MODELS = ("ngram", "[ngram]")


class UnsupportedSpeculativeConfigError(ValueError):
    """A speculative decoding setting a KerasHub target is not served with."""


def method_of(speculative_config):
    """The method of a speculative config, as vLLM will infer it.

    Args:
        speculative_config: The `speculative_config` engine argument (a dict)
            or vLLM's `SpeculativeConfig`.
    """
    if not isinstance(speculative_config, dict):
        return speculative_config.method
    method = speculative_config.get("method")
    if method is not None:
        return method
    model = speculative_config.get("model")
    if model in _NGRAM_MODELS:
        return "ngram"
    from vllm.config import SpeculativeConfig

    if SpeculativeConfig._is_custom_proposer_path(model):
        return "custom_class"
    return "draft_model"


def check(speculative_config, pipeline=None, images=False, lora_weights=None):
    """Raises for speculative settings a KerasHub target is not served with.

    Args:
        speculative_config: As for `method_of`, or `None`.
        pipeline: The pipeline-parallel size, if set.
        images: Whether the target serves images.
        lora_weights: The adapter merged into the target at load, if any.
    """
    if speculative_config is None:
        return
    method = method_of(speculative_config)
    if method not in SERVED_METHODS:
        raise UnsupportedSpeculativeConfigError(
            f"Speculative method {method!r} is not served for KerasHub "
            "targets: it feeds the drafter the target's hidden states and "
            "embedding (`model.embed_tokens`), which vllm-keras-hub's model "
            "class does not hand to drafters. Served methods: "
            f"{', '.join(SERVED_METHODS)}; for `draft_model`, a KerasHub "
            "preset of the same vocabulary as 'keras_hub:<preset>'."
        )
    if method == "draft_model" and (pipeline or 1) > 1:
        raise UnsupportedSpeculativeConfigError(
            "A draft model cannot run under pipeline parallelism "
            f"(pipeline_parallel_size={pipeline}): vLLM 0.32 builds the drafter "
            "on the last stage only (`GPUModelRunner.__init__`), and every "
            "other stage's worker fails at start-up reading it "
            "(`_check_and_update_cudagraph_mode`)."
        )
    if method == "draft_model" and images:
        raise UnsupportedSpeculativeConfigError(
            "A draft model is not served with a target that serves images: "
            "a tiny Gemma3 vision preset drafted by its text preset gave other "
            "greedy tokens than its generate() for prompts ending shortly "
            "after an image (n-gram drafts on it were exact), so drafting is "
            "not exact there yet. Serve the preset without a draft model, or "
            "with method 'ngram'."
        )
    if method == "draft_model" and lora_weights:
        raise UnsupportedSpeculativeConfigError(
            "A draft model cannot be served with a merged adapter "
            f"(lora_weights={lora_weights!r}): vLLM 0.32 loads the draft with "
            "the target's load config, so the adapter would be merged into "
            "the draft too."
        )


def check_draft_attention(specs, hybrid_kv_cache_manager, name):
    """Raises for a draft whose attention vLLM's draft proposer cannot run.

    Args:
        specs: The probe's `AttentionSpec` of each of the draft's layers.
        hybrid_kv_cache_manager: Whether the engine groups KV caches by
            attention kind (vLLM's default on GPUs).
        name: The draft, for the message.
    """
    if any(spec.kv_sharing_target is not None for spec in specs):
        raise UnsupportedSpeculativeConfigError(
            f"{name} cannot be a draft model: some of its layers read another "
            "layer's keys and values, and vLLM 0.32's draft proposer "
            "(`validate_same_kv_cache_group`) needs every draft attention layer "
            "to hold its own KV cache in one group."
        )
    windows = {spec.sliding_window for spec in specs}
    if len(windows) > 1 and hybrid_kv_cache_manager:
        raise UnsupportedSpeculativeConfigError(
            f"{name} mixes sliding-window and full attention layers, which the "
            "hybrid KV cache manager keeps in separate KV cache groups, and vLLM "
            "0.32's draft proposer (`validate_same_kv_cache_group`) runs a draft "
            "from one group only. Serve it as a draft with "
            "--disable-hybrid-kv-cache-manager (disable_hybrid_kv_cache_manager="
            "True): every layer then keeps one KV cache kind, whole-sequence."
        )


def _is_keras_hub_folder(path):
    config = os.path.join(os.path.expanduser(str(path)), "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        return "keras_hub_preset" in json.load(f)


def _check_draft_folder(draft, preset):
    if draft.embedder:
        raise UnsupportedSpeculativeConfigError(
            f"The draft {preset!r} is a text embedder; a draft must generate."
        )
    if draft.images:
        raise UnsupportedSpeculativeConfigError(
            f"The draft {preset!r} serves images. vLLM 0.32 hands a multimodal "
            "draft the target's image embeddings shifted one token, as EAGLE "
            "reads them (`GPUModelRunner._gather_mm_embeddings("
            "shift_computed_tokens=1)`), which do not line up with a draft "
            "model's own tokens. Draft with a text-only preset of the same "
            "vocabulary (an image target's images reach it as their tokens)."
        )
    if draft.family.hybrid:
        raise UnsupportedSpeculativeConfigError(
            f"The draft {preset!r} is a hybrid {draft.family.display_name} "
            "preset: vLLM keeps no recurrent state for a draft model's layers."
        )


def _check_same_vocabulary(target_preset, draft_preset):
    from keras_hub.models import Tokenizer

    target = Tokenizer.from_preset(target_preset).get_vocabulary()
    draft = Tokenizer.from_preset(draft_preset).get_vocabulary()
    if target == draft:
        return
    if len(target) != len(draft):
        differs = f"{len(draft)} tokens against the target's {len(target)}"
    else:
        index = next(i for i, (a, b) in enumerate(zip(target, draft)) if a != b)
        differs = (
            f"token {index} is {draft[index]!r} in the draft and "
            f"{target[index]!r} in the target"
        )
    raise UnsupportedSpeculativeConfigError(
        f"The draft {draft_preset!r} has another vocabulary than the target "
        f"{target_preset!r} ({differs}). A draft model proposes token ids, so "
        "it must share the target's tokenizer."
    )


def settle(target, values):
    """Points a KerasHub draft at its model folder, after checking it all.

    Args:
        target: The target's `ModelFolder`.
        values: The user's vLLM engine arguments by name.

    Returns:
        `(updates, draft)`: engine arguments to set, and the draft's
        `ModelFolder` (the caller keeps it until the engine stops), or
        `None`.
    """
    from vllm_keras_hub.export.model_folder import ModelFolder

    spec = values.get("speculative_config")
    lora_weights = (values.get("model_loader_extra_config") or {}).get("lora_weights")
    check(spec, values.get("pipeline_parallel_size"), bool(target.images), lora_weights)
    if spec is None or method_of(spec) != "draft_model":
        return {}, None
    model = spec.get("model")
    preset = strip_prefix(model)
    if preset is None:
        if model is not None and not _is_keras_hub_folder(model):
            raise UnsupportedSpeculativeConfigError(
                f"The draft {model!r} is not a KerasHub preset: vLLM 0.32 loads "
                "a draft model with the target's load format, so a KerasHub "
                "target's draft is a preset too, 'keras_hub:<preset>'."
            )
        return {}, None
    draft = ModelFolder(preset, max_model_len=values.get("max_model_len"))
    try:
        _check_draft_folder(draft, preset)
        if not spec.get("use_heterogeneous_vocab"):
            _check_same_vocabulary(target.preset, draft.preset)
    except BaseException:
        draft.cleanup()
        raise
    return {"speculative_config": {**spec, "model": draft.path}}, draft

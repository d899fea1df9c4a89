"""Speculative decoding for KerasHub targets: KerasHub drafts and EAGLE-3 heads.

vLLM's `draft_model` method runs a smaller generative model of the target's
vocabulary as the drafter, in the target's worker, with its own paged KV
cache; the target verifies every drafted token, so greedy output is the
target's own. A KerasHub preset drafts as `keras_hub:<preset>`: `settle`
writes its model folder and points the speculative config at it, and vLLM
builds our model class for it under the `draft_model` prefix. `eagle3`
runs a published EAGLE-3 head on the target's aux hidden states
(`layers/eagle3.py`). `mtp` runs a Gemma4 assistant preset for a Gemma4
target (`families/gemma4/mtp.py`).

What vLLM 0.32 does that decides the rest:
- Drafters load with the target's load config (`get_draft_load_config`;
  `DraftModelProposer._get_model` passes none), so the `keras_hub` loader
  hands a drafter that is not a preset (an EAGLE-3 head, a Hugging Face
  draft model) to vLLM's own loader, and a merged adapter would reach a
  KerasHub draft.
- `verify_equal_vocab_size_if_draft_model` compares vocabulary sizes only;
  a draft whose tokens mean other things would pass and draft nothing
  useful. `settle` compares the vocabularies themselves.
- `validate_same_kv_cache_group` needs every draft attention layer in one
  KV cache group: a draft mixing sliding-window and full layers runs only
  with the hybrid KV cache manager off (which then keeps whole-sequence KV
  for sliding layers), and one whose layers share KV (Gemma3n, Gemma4)
  does not run at all. `check_draft_attention` says so at load.
- An EAGLE-3 head without its own `lm_head` would share the target's vLLM
  `ParallelLMHead` (`_maybe_share_lm_head`), which a KerasHub target has
  only under tensor parallelism; EAGLE(-1) heads ship none.
- vLLM picks its Gemma4 MTP proposer by the draft config's model type
  (`use_gemma4_mtp`), and MTP drafters of other families read the target's
  layers by vLLM's module names.
"""

import json
import os

from vllm_keras_hub import families
from vllm_keras_hub.export.preset_folder import strip_prefix

# The module prefix vLLM builds a `draft_model` drafter under.
DRAFT_PREFIX = "draft_model"
# Methods a KerasHub target is served with: drafters that need nothing of
# the target but its tokens (and, for `custom_class`, whatever the user's
# class reads, which is theirs to check), EAGLE-3 heads, which read its
# aux hidden states and token embedding (`layers/eagle3.py`), and Gemma4
# assistants (`mtp`).
SERVED_METHODS = (
    "draft_model", "eagle3", "mtp", "ngram", "ngram_gpu", "suffix", "custom_class"
)  # fmt: skip
# Methods that run a drafter model in the target's worker.
_MODEL_METHODS = ("draft_model", "eagle3", "mtp")
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
    # As `SpeculativeConfig.__post_init__` infers it from the draft's name.
    name = str(model).lower()
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    return "draft_model"


def check(
    speculative_config,
    pipeline=None,
    images=False,
    lora_weights=None,
    family=None,
):
    """Raises for speculative settings a KerasHub target is not served with.

    Args:
        speculative_config: As for `method_of`, or `None`.
        pipeline: The pipeline-parallel size, if set.
        images: Whether the target serves images.
        lora_weights: The adapter merged into the target at load, if any.
        family: The target's `families.Family`, if known.
    """
    if speculative_config is None:
        return
    method = method_of(speculative_config)
    if method == "mtp":
        _check_mtp(speculative_config, family, lora_weights)
    if method not in SERVED_METHODS:
        raise UnsupportedSpeculativeConfigError(
            f"Speculative method {method!r} is not served for KerasHub "
            "targets: EAGLE(-1) heads share the target's output head, which "
            "a KerasHub target does not have as a vLLM layer. Served methods: "
            f"{', '.join(SERVED_METHODS)}; for `draft_model`, a KerasHub "
            "preset of the same vocabulary as 'keras_hub:<preset>'."
        )
    if method not in _MODEL_METHODS:
        return
    if (pipeline or 1) > 1:
        raise UnsupportedSpeculativeConfigError(
            f"Method {method!r} cannot run under pipeline parallelism "
            f"(pipeline_parallel_size={pipeline}): vLLM 0.32 builds the drafter "
            "on the last stage only (`GPUModelRunner.__init__`), and every "
            "other stage's worker fails at start-up reading it "
            "(`_check_and_update_cudagraph_mode`)."
        )
    if images and method == "eagle3":
        raise UnsupportedSpeculativeConfigError(
            "EAGLE-3 is not served with a target that serves images yet: vLLM "
            "0.32's proposer hands the head the target's image embeddings and "
            "reads the target config's image token, and no test covers that "
            "for a KerasHub image target. Serve the preset without it, or "
            "with method 'ngram'."
        )
    # A Gemma4 assistant reads only the target's hidden states and cache,
    # whatever a prompt's media (`tests/mtp_test.py`).
    if images and method != "mtp":
        raise UnsupportedSpeculativeConfigError(
            f"Method {method!r} is not served with a target that serves images: "
            "a tiny Gemma3 vision preset drafted by its text preset gave other "
            "greedy tokens than its generate() for prompts ending shortly "
            "after an image (n-gram drafts on it were exact), so model drafters "
            "are not exact there yet. Serve the preset without one, or with "
            "method 'ngram'."
        )
    refusal = family.speculative_refusals.get(method) if family else None
    if refusal:
        raise UnsupportedSpeculativeConfigError(
            f"Method {method!r} is not served for {family.display_name}: {refusal}"
        )
    if (
        method == "draft_model"
        and lora_weights
        and _keras_hub_draft(speculative_config)
    ):
        raise UnsupportedSpeculativeConfigError(
            "A KerasHub draft model cannot be served with a merged adapter "
            f"(lora_weights={lora_weights!r}): vLLM 0.32 loads the draft with "
            "the target's load config, so the adapter would be merged into "
            "the draft too."
        )


def _check_mtp(speculative_config, family, lora_weights):
    if family is not None and not family.drafters:
        served = [f.display_name for f in families.FAMILIES if f.drafters]
        raise UnsupportedSpeculativeConfigError(
            f"Method 'mtp' is served for {' and '.join(served)} targets, "
            "drafted by an assistant preset of their family; this target is "
            f"a {family.backbone}. Other families' MTP drafters read the "
            "target's layers by vLLM's module names, which a KerasHub target "
            "does not have."
        )
    if not _keras_hub_draft(speculative_config):
        raise UnsupportedSpeculativeConfigError(
            "Method 'mtp' for a KerasHub Gemma4 target takes a KerasHub "
            "Gemma4 assistant preset as its model, e.g. "
            '{"method": "mtp", "model": "keras_hub:gemma4_instruct_2b_assistant"}.'
        )
    if lora_weights:
        raise UnsupportedSpeculativeConfigError(
            "A Gemma4 assistant cannot draft for a target with a merged "
            f"adapter (lora_weights={lora_weights!r}): vLLM 0.32 loads the "
            "drafter with the target's load config, adapter included."
        )


def _keras_hub_draft(speculative_config):
    if isinstance(speculative_config, dict):
        model = speculative_config.get("model")
        return strip_prefix(model) is not None or _is_keras_hub_folder(model)
    draft = speculative_config.draft_model_config
    return hasattr(getattr(draft, "hf_config", None), "keras_hub_preset")


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
    if path is None:
        return False
    config = os.path.join(os.path.expanduser(str(path)), "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        return "keras_hub_preset" in json.load(f)


def _check_drafter_kind(draft, preset, method):
    """Raises where the preset's kind does not fit the method."""
    if method == "mtp" and draft.drafter is None:
        tasks = " or ".join(f"`{task}`" for task in families.DRAFTERS)
        raise UnsupportedSpeculativeConfigError(
            f"Method 'mtp' needs an assistant preset (a {tasks}), and "
            f"{preset!r} is not one: draft with it as method 'draft_model'."
        )
    if method != "mtp" and draft.drafter is not None:
        raise UnsupportedSpeculativeConfigError(
            f"{preset!r} is a {draft.family.display_name} assistant: it drafts "
            "from the target's hidden states and cache, as method 'mtp', not "
            f"as a {method!r} drafter."
        )


def _check_draft_folder(draft, preset):
    if draft.pooling:
        raise UnsupportedSpeculativeConfigError(
            f"The draft {preset!r} is a {draft.pooling['task']}; a draft must generate."
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
    """Raises unless the draft holds the target's token at every id."""
    from vllm_keras_hub.export.checkpoint_tokenizer import tokens_by_id
    from vllm_keras_hub.export.preset_folder import read_preset
    from vllm_keras_hub.export.preset_folder import read_tokenizers

    def tokens(preset):
        _, backbone_config, causal_lm_cls = read_preset(preset)
        return tokens_by_id(read_tokenizers(preset, backbone_config, causal_lm_cls)[0])

    # Id by id: a byte-pair tokenizer's `get_vocabulary()` is a `dict_keys`,
    # which compares as a set, so a draft with permuted ids would pass.
    target = tokens(target_preset)
    draft = tokens(draft_preset)
    if target == draft:
        return
    index = next((i for i, (a, b) in enumerate(zip(target, draft)) if a != b), None)
    if index is None:
        differs = f"{len(draft)} token ids against the target's {len(target)}"
    else:
        differs = (
            f"token id {index} is {draft[index]!r} in the draft and "
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
    if target.drafter is not None:
        raise UnsupportedSpeculativeConfigError(
            f"{target.preset!r} is a Gemma4 assistant, which only drafts for "
            "a Gemma4 target: serve the target with --speculative-config "
            f'\'{{"method": "mtp", "model": "keras_hub:{target.preset}"}}\'.'
        )
    check(
        spec,
        values.get("pipeline_parallel_size"),
        bool(target.images),
        lora_weights,
        target.family,
    )
    if spec is None:
        return {}, None
    method = method_of(spec)
    if method == "eagle3":
        _check_eagle3_head(spec.get("model"))
    if method not in ("draft_model", "mtp"):
        return {}, None
    preset = strip_prefix(spec.get("model"))
    if preset is None:  # A Hugging Face draft, loaded by vLLM's own loader.
        return {}, None
    draft = ModelFolder(preset, max_model_len=values.get("max_model_len"))
    try:
        _check_drafter_kind(draft, preset, method)
        _check_draft_folder(draft, preset)
        if not spec.get("use_heterogeneous_vocab"):
            _check_same_vocabulary(target.preset, draft.preset)
    except BaseException:
        draft.cleanup()
        raise
    return {"speculative_config": {**spec, "model": draft.path}}, draft


def _check_eagle3_head(model):
    """Raises for a local EAGLE-3 head without its own output head."""
    if model is None or not os.path.isdir(os.path.expanduser(str(model))):
        return
    from safetensors import safe_open

    folder = os.path.expanduser(str(model))
    files = [name for name in os.listdir(folder) if name.endswith(".safetensors")]
    names = set()
    for name in files:
        with safe_open(os.path.join(folder, name), framework="pt") as f:
            names.update(f.keys())
    if files and not any("lm_head" in name for name in names):
        raise UnsupportedSpeculativeConfigError(
            f"The EAGLE-3 head {model!r} has no `lm_head` of its own, so vLLM "
            "would give it the target's vLLM `ParallelLMHead` "
            "(`_maybe_share_lm_head`), which a KerasHub target has only under "
            "tensor parallelism: on one rank its output head is its KerasHub "
            "token embedding."
        )

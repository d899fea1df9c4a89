"""Every KerasHub causal-LM family, and whether it has a route to vLLM.

One table, keyed by the backbone class a preset's `config.json` names. A family
with a route runs its own KerasHub layers with attention handed to vLLM's
`Attention`; every other family is refused at start-up with its reason, never
served by a slower or wrong fallback.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Family:
    """How one KerasHub family is served.

    Args:
        name: Short family key, e.g. `"llama3"`.
        display_name: What users call it, e.g. `"Gemma / Gemma2"`.
        backbone: The KerasHub backbone class name presets record.
        route: Where attention reaches vLLM: `"keras_hub"` for the serving
            route keras-hub itself ships, `"vllm_keras_hub"` for one of
            `layers.attention.ROUTES`, `None` for no route.
        stop_tokens: Turn-end tokens the family's `CausalLM.generate()`
            stops on besides the tokenizer's `end_token_id` (and
            `end_token2_id`, read from the tokenizer itself).
        unsupported_reason: Why a family without a route cannot be served.
        tensor_parallel: Whether its layers shard across tensor-parallel
            ranks (`layers/parallel_linear.py`); set where `parallel_test.py`
            proves it (Llama shares Llama3's layers).
        hybrid: Whether some layers keep a recurrent state in vLLM's state
            cache instead of a KV cache (`layers/state_routes.py`).
        embedder_only: An encoder family, served only as a text embedder
            (`export/embedder.py`), never to generate.
    """

    name: str
    display_name: str
    backbone: str
    route: str | None = "keras_hub"
    stop_tokens: tuple[str, ...] = ()
    unsupported_reason: str = ""
    tensor_parallel: bool = False
    hybrid: bool = False
    embedder_only: bool = False


FAMILIES = (
    Family("gpt2", "GPT-2", "GPT2Backbone", tensor_parallel=True),
    Family("opt", "OPT", "OPTBackbone", tensor_parallel=True),
    Family("llama", "Llama", "LlamaBackbone", tensor_parallel=True),
    Family("llama3", "Llama3", "Llama3Backbone", tensor_parallel=True),
    Family("mistral", "Mistral", "MistralBackbone", tensor_parallel=True),
    # Our route, not keras-hub's: keras-hub's passes a sliding window that
    # Qwen's `generate()` never applies on torch (see layers/attention_routes.py, `qwen`).
    Family(
        "qwen", "Qwen 2/2.5", "QwenBackbone", "vllm_keras_hub", tensor_parallel=True
    ),
    # Our route, not keras-hub's: keras-hub's passes a sliding window that
    # Qwen3's `generate()` never applies on torch (see layers/attention_routes.py, `qwen3`).
    Family("qwen3", "Qwen3", "Qwen3Backbone", "vllm_keras_hub", tensor_parallel=True),
    Family("gemma", "Gemma / Gemma2", "GemmaBackbone", tensor_parallel=True),
    Family(
        "gemma3",
        "Gemma3 (text)",
        "Gemma3Backbone",
        stop_tokens=("<end_of_turn>",),
        tensor_parallel=True,
    ),
    Family("mixtral", "Mixtral", "MixtralBackbone", "vllm_keras_hub", tensor_parallel=True),
    Family(
        "qwen_moe", "Qwen1.5-MoE", "QwenMoeBackbone", "vllm_keras_hub", tensor_parallel=True
    ),
    Family(
        "qwen3_moe",
        "Qwen3-MoE",
        "Qwen3MoeBackbone",
        "vllm_keras_hub",
        tensor_parallel=True,
    ),
    Family("smollm3", "SmolLM3", "SmolLM3Backbone", "vllm_keras_hub", tensor_parallel=True),
    Family(
        "phi3", "Phi-3", "Phi3Backbone", "vllm_keras_hub", ("<|end|>",), tensor_parallel=True
    ),
    # Served as the model's forward computes it; KerasHub's own cached
    # decode rotates the query at position 0 (see layers/attention_routes.py, `gpt_neox`).
    Family(
        "gpt_neox", "GPT-NeoX", "GPTNeoXBackbone", "vllm_keras_hub", tensor_parallel=True
    ),
    Family("bloom", "Bloom", "BloomBackbone", "vllm_keras_hub", tensor_parallel=True),
    Family("falcon", "Falcon", "FalconBackbone", "vllm_keras_hub", tensor_parallel=True),
    Family(
        "gpt_oss", "GPT-OSS", "GptOssBackbone", "vllm_keras_hub", tensor_parallel=True
    ),
    # KV sharing: the last `num_kv_shared_layers` layers attend over an
    # earlier layer's cache (`layers.attention.ROUTES`).
    Family(
        "gemma3n",
        "Gemma3n",
        "Gemma3nBackbone",
        "vllm_keras_hub",
        ("<end_of_turn>",),
        tensor_parallel=True,
    ),
    Family(
        "gemma4",
        "Gemma4",
        "Gemma4Backbone",
        "vllm_keras_hub",
        ("<turn|>",),
        tensor_parallel=True,
    ),
    # Hybrid: Gated DeltaNet layers keep their state in vLLM's state cache
    # (layers/state_routes.py); every 4th layer attends.
    Family(
        "qwen3_5",
        "Qwen3.5",
        "Qwen3_5Backbone",
        "vllm_keras_hub",
        tensor_parallel=True,
        hybrid=True,
    ),
    Family(
        "qwen3_5_moe",
        "Qwen3.5-MoE",
        "Qwen3_5MoeBackbone",
        "vllm_keras_hub",
        tensor_parallel=True,
        hybrid=True,
    ),
    # Vision-language, prefix-LM: every prompt is an image and its text,
    # attended bidirectionally; the output causally (`models/prefix_lm.py`).
    Family("pali_gemma", "PaliGemma", "PaliGemmaBackbone", tensor_parallel=True),
    # Encoders: their text embedders only, attention bidirectional.
    Family("bert", "BERT", "BertBackbone", "vllm_keras_hub", embedder_only=True),
    Family(
        "xlm_roberta",
        "XLM-RoBERTa",
        "XLMRobertaBackbone",
        "vllm_keras_hub",
        embedder_only=True,
    ),
    Family(
        "rwkv7",
        "RWKV7",
        "RWKV7Backbone",
        None,
        (),
        "it has no attention at all (recurrent state only)",
    ),
)

_BY_BACKBONE = {family.backbone: family for family in FAMILIES}
_BY_NAME = {family.name: family for family in FAMILIES}


class UnsupportedFamilyError(ValueError):
    """A preset whose family vllm-keras-hub cannot serve."""


def supported_families():
    """Display names of the causal-LM families with a route, in table order."""
    return [
        family.display_name
        for family in FAMILIES
        if family.route and not family.embedder_only
    ]


def tensor_parallel_families():
    """Display names of the families served with tensor parallelism."""
    return [family.display_name for family in FAMILIES if family.tensor_parallel]


def family_by_name(name):
    """Returns the `Family` with key `name`."""
    return _BY_NAME[name]


def family_for_backbone(backbone_class_name, preset=None):
    """Returns the servable `Family` of a backbone class name.

    Args:
        backbone_class_name: The class name a preset's `config.json` records
            under `class_name`, e.g. `"Llama3Backbone"`.
        preset: The preset, only for the error message.

    Raises:
        UnsupportedFamilyError: naming the family, why it cannot be served,
            and the families that can.
    """
    family = _BY_BACKBONE.get(backbone_class_name)
    where = f"Preset '{preset}'" if preset else "This preset"
    supported = ", ".join(supported_families())
    if family is None:
        raise UnsupportedFamilyError(
            f"{where} uses {backbone_class_name}, which is not a KerasHub "
            f"causal-LM family vllm-keras-hub knows. Supported families: "
            f"{supported}."
        )
    if family.route is None:
        raise UnsupportedFamilyError(
            f"{where} is a {family.display_name} model ({backbone_class_name}), "
            f"which vllm-keras-hub cannot serve yet: {family.unsupported_reason}. "
            f"Supported families: {supported}."
        )
    return family

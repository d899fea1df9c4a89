"""The Hugging Face config type that carries a KerasHub preset into vLLM.

vLLM reads `config.json` through transformers' `AutoConfig`, keyed by
`model_type`, and picks the model class by `architectures`. This config holds
the real dims vLLM sizes the KV cache from, plus the preset reference. It is
defined at module level so it pickles across vLLM's spawned processes.
"""

from transformers import AutoConfig
from transformers import PretrainedConfig

MODEL_TYPE = "keras_hub_torch"
ARCHITECTURE = "KerasHubForCausalLM"
# The model class of presets that mix attention with recurrent-state layers.
HYBRID_ARCHITECTURE = "KerasHubHybridForCausalLM"
# The model classes of presets served with images (`vision.py`), by
# backbone: one per family, as vLLM names a multimodal model class per
# family, since each has its own image placeholder.
VISION_ARCHITECTURES = {
    "Gemma3Backbone": "KerasHubVisionForCausalLM",
    "Gemma3nBackbone": "KerasHubGemma3nVisionForCausalLM",
    "Gemma4Backbone": "KerasHubGemma4VisionForCausalLM",
}
# The load format that builds a KerasHub model from its preset (`loading/load_format.py`).
LOAD_FORMAT = "keras_hub"
# The tokenizer mode under which keras-hub's own `KerasHubTokenizer` serves a
# tokenizer that cannot be exported exactly.
KERAS_HUB_TOKENIZER_MODE = "keras_hub"


class KerasHubConfig(PretrainedConfig):
    """Config of a KerasHub preset served on vLLM's torch model runner.

    Args:
        keras_hub_preset: What `keras_hub.models.CausalLM.from_preset`
            accepts: a Kaggle handle, `hf://...`, or a local folder.
        keras_hub_family: The family key in `families.FAMILIES`.
        vocab_size: Rows of the token embedding (the logits width).
        hidden_size: Backbone hidden size.
        num_hidden_layers: Transformer layers; one KV cache each.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads.
        head_dim: Per-head size.
        max_position_embeddings: The longest sequence the preset supports.
    """

    model_type = MODEL_TYPE

    def __init__(
        self,
        keras_hub_preset=None,
        keras_hub_family=None,
        vocab_size=1,
        hidden_size=1,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=None,
        head_dim=None,
        max_position_embeddings=8192,
        **kwargs,
    ):
        self.keras_hub_preset = keras_hub_preset
        self.keras_hub_family = keras_hub_family
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        super().__init__(**kwargs)


# What a Gated DeltaNet layer's state takes, as Qwen3.5's backbone config
# and Hugging Face's name it: vLLM sizes state pages from these.
_LINEAR_ATTENTION_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def hybrid_fields(backbone_config):
    """The `config.json` fields of a hybrid preset; `{}` for attention only.

    The architecture is `HYBRID_ARCHITECTURE`, `layer_types` says which
    layers attend (`"full_attention"`) and which keep a Gated DeltaNet
    state (`"linear_attention"`), and the `linear_*` fields size that state.
    """
    if "linear_num_key_heads" not in backbone_config:
        return {}
    layer_types = backbone_config.get("layer_types") or [
        # `Qwen3_5Backbone`'s default: every 4th layer attends.
        "linear_attention" if (i + 1) % 4 else "full_attention"
        for i in range(backbone_config["num_layers"])
    ]
    if "linear_attention" not in layer_types:
        return {}
    fields = {name: int(backbone_config[name]) for name in _LINEAR_ATTENTION_FIELDS}
    return dict(architectures=[HYBRID_ARCHITECTURE], layer_types=list(layer_types), **fields)


def register_config():
    """Teaches transformers' `AutoConfig` our model type. Re-entrant."""
    try:
        AutoConfig.register(MODEL_TYPE, KerasHubConfig)
    except ValueError:
        pass  # Already registered in this process.


class UnsupportedParallelismError(ValueError):
    """A parallel layout KerasHub models cannot be served in yet."""


# Backbone class -> why it cannot be cut into pipeline stages
# (`pipeline.py`): more than the hidden states crosses between its layers.
_HYBRID_STAGES = (
    "its Gated DeltaNet layers' state layers are not placed in pipeline "
    "stages yet"
)
PIPELINE_REFUSALS = {
    "Qwen3_5Backbone": _HYBRID_STAGES,
    "Qwen3_5MoeBackbone": _HYBRID_STAGES,
    "Gemma3nBackbone": (
        "its layers pass a stack of AltUp hidden states and per-layer "
        "inputs from layer to layer, not one hidden state"
    ),
    "Gemma4Backbone": (
        "its KV-sharing layers read the keys and values of layers that "
        "can be in another stage, and its per-layer inputs come from the "
        "token embedding"
    ),
}


def check_parallelism(
    family,
    tensor_parallel_size,
    pipeline_parallel_size=None,
    enable_expert_parallel=False,
):
    """Raises unless `family` can be served at this parallelism.

    Args:
        family: The preset's `families.Family`.
        tensor_parallel_size: vLLM's `tensor_parallel_size`.
        pipeline_parallel_size: vLLM's `pipeline_parallel_size`.
        enable_expert_parallel: vLLM's `enable_expert_parallel`.

    Raises:
        UnsupportedParallelismError: naming the family and what to use.
    """
    from vllm_keras_hub.models import families

    staged = pipeline_parallel_size and pipeline_parallel_size > 1
    reason = PIPELINE_REFUSALS.get(family.backbone) if staged else None
    if reason is not None:
        raise UnsupportedParallelismError(
            f"{family.display_name} cannot be served with pipeline parallelism "
            f"(pipeline_parallel_size={pipeline_parallel_size}): {reason}. "
            "Use tensor parallelism (--tensor-parallel-size) where it is "
            "supported, or data parallelism (--data-parallel-size)."
        )
    if enable_expert_parallel:
        raise UnsupportedParallelismError(
            "Expert parallelism (enable_expert_parallel) is not supported for "
            "KerasHub models: vLLM 0.32's CPU fused-MoE experts take no expert "
            "map, and its workers crashed when tried. Under tensor parallelism "
            "the experts are already sharded by vLLM's FusedMoE; serve without "
            "--enable-expert-parallel."
        )
    sharded = tensor_parallel_size and tensor_parallel_size > 1
    if sharded and not family.tensor_parallel:
        mapped = ", ".join(families.tensor_parallel_families())
        raise UnsupportedParallelismError(
            f"{family.display_name} cannot be served with tensor parallelism "
            f"yet (tensor_parallel_size={tensor_parallel_size}): its layers are "
            f"not mapped to vLLM's parallel linear layers. Families that are: "
            f"{mapped}. Serve it with tensor_parallel_size=1, or scale out "
            "with --data-parallel-size."
        )


class UnsupportedHybridConfigError(ValueError):
    """An engine setting hybrid (Gated DeltaNet) presets cannot be served with."""


def check_hybrid_settings(
    speculative=False,
    mamba_ssm_cache_dtype="auto",
    mamba_cache_dtype="auto",
    mamba_cache_mode=None,
    enable_lora=False,
):
    """Raises for engine settings a hybrid preset's state cannot be served with.

    Checked before the engine starts (`KerasHubLLM`, `serve`) and again by
    the hybrid model class, for plain `vllm` commands.

    Args:
        speculative: Whether speculative decoding is configured.
        mamba_ssm_cache_dtype: vLLM's `mamba_ssm_cache_dtype`.
        mamba_cache_dtype: vLLM's `mamba_cache_dtype`.
        mamba_cache_mode: vLLM's `mamba_cache_mode`, or `None` if unset.
        enable_lora: vLLM's `enable_lora`.

    Raises:
        UnsupportedHybridConfigError: naming the setting and why.
    """
    if speculative:
        raise UnsupportedHybridConfigError(
            "Speculative decoding is not supported for KerasHub's hybrid "
            "(Gated DeltaNet) presets: rolling back rejected draft tokens "
            "needs vLLM's wider speculative state layout, which their state "
            "layers do not implement. Serve without --speculative-config."
        )
    # vLLM's CPU platform itself turns "auto" into "float32" for GDN models.
    if mamba_ssm_cache_dtype not in (None, "auto", "float32"):
        raise UnsupportedHybridConfigError(
            f"mamba_ssm_cache_dtype={mamba_ssm_cache_dtype!r} is not supported: "
            "KerasHub keeps a Gated DeltaNet layer's recurrent state in "
            "float32, and served output must equal the preset's own."
        )
    if mamba_cache_dtype not in (None, "auto"):
        raise UnsupportedHybridConfigError(
            f"mamba_cache_dtype={mamba_cache_dtype!r} is not supported: KerasHub "
            "keeps a Gated DeltaNet layer's convolution window in the model's "
            "dtype."
        )
    if mamba_cache_mode not in (None, "none", "align"):
        raise UnsupportedHybridConfigError(
            f"mamba_cache_mode={mamba_cache_mode!r} is not supported for Gated "
            "DeltaNet layers: prefix caching runs in 'align' mode."
        )
    if enable_lora:
        raise UnsupportedHybridConfigError(
            "LoRA adapters per request (--enable-lora) are not supported for "
            "hybrid (Gated DeltaNet) presets yet: no test proves them exact "
            "there. Serve without --enable-lora."
        )

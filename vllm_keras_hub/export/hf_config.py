"""The Hugging Face config type that carries a KerasHub preset into vLLM.

vLLM reads `config.json` through transformers' `AutoConfig`, keyed by
`model_type`, and picks the model class by `architectures`. This config holds
the real dims vLLM sizes the KV cache from, plus the preset reference. It is
defined at module level so it pickles across vLLM's spawned processes.
"""

from transformers import AutoConfig
from transformers import PretrainedConfig

MODEL_TYPE = "keras_hub_torch"
# Its tokenizer modes, by the folder's own: the same tokenizer, with a
# renderer that refuses prompts without an image
# (`entrypoints/image_first_renderer.py`).
IMAGE_FIRST_TOKENIZER_MODES = {
    "auto": "keras_hub_image_first",
    "keras_hub_torch": "keras_hub_image_first_own",
}
# The load format that builds a KerasHub model from its preset
# (`loading/load_format.py`).
LOAD_FORMAT = "keras_hub"
# The tokenizer mode under which keras-hub's own `KerasHubTokenizer` serves a
# tokenizer that cannot be exported exactly.
KERAS_HUB_TOKENIZER_MODE = "keras_hub_torch"
# Its name before: keras-hub's own plugin registers `keras_hub` for its own
# tokenizer, so ours is kept under it only where that plugin did not run.
FORMER_KERAS_HUB_TOKENIZER_MODE = "keras_hub"
# The same for a text embedder, which packs texts as its preprocessor does
# (`export/keras_hub_tokenizers.py`).
KERAS_HUB_EMBEDDER_TOKENIZER_MODE = "keras_hub_embedder"
# An encoder-decoder preset's exported tokenizer, with a renderer that takes
# a plain prompt as the encoder's text (`tasks/seq_2_seq_lm/renderer.py`).
SEQ2SEQ_TOKENIZER_MODE = "keras_hub_seq2seq"
# A speech-to-text preset's exported tokenizer, with a renderer that refuses
# a request without a clip (`tasks/audio_to_text/renderer.py`).
AUDIO_TO_TEXT_TOKENIZER_MODE = "keras_hub_audio_to_text"


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
        keras_hub_drafter: The Hugging Face model type of a drafter preset
            (`"gemma4_assistant"`), which vLLM reads to pick its proposer
            (`SpeculativeConfig.hf_config_override`), or `None`.
        backbone_hidden_size: A drafter's target hidden size, which it is
            fed (vLLM sizes the hidden states it hands drafters from it).
    """

    model_type = MODEL_TYPE
    # M-RoPE's fields (`export/image_format.py`), as transformers' own
    # Qwen3.5 config lets them through its RoPE validation.
    ignore_keys_at_rope_validation = {"mrope_section", "mrope_interleaved"}

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
        keras_hub_drafter=None,
        backbone_hidden_size=None,
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
        self.keras_hub_drafter = keras_hub_drafter
        super().__init__(**kwargs)
        if keras_hub_drafter is not None:
            # The instance's type only: `config.json` keeps ours, which
            # transformers maps back to this class.
            self.model_type = keras_hub_drafter
            self.backbone_hidden_size = backbone_hidden_size


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

    `layer_types` says which layers attend (`"full_attention"`) and which
    keep a Gated DeltaNet state (`"linear_attention"`), and the `linear_*`
    fields size that state; `architectures.choose` picks the hybrid class.
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
    return dict(layer_types=list(layer_types), **fields)


def read_media_format(config, modality, fields):
    """A model folder's `keras_hub_<modality>` format, checked whole, or
    `None` where the preset is served without that modality.

    Args:
        config: The folder's `KerasHubConfig`.
        modality: `"image"`, `"audio"` or `"video"`.
        fields: Every field the format must have.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    media = getattr(config, f"keras_hub_{modality}", None)
    if media is None:
        return None
    missing = [field for field in fields if field not in media]
    if missing:
        raise ValueError(
            f"This model folder's {modality} format lacks {missing}: it was "
            "exported by an older vllm-keras-hub. Export it again "
            "(`vllm-keras-hub export`)."
        )
    return media


def register_config():
    """Teaches transformers' `AutoConfig` our model type. Re-entrant."""
    try:
        AutoConfig.register(MODEL_TYPE, KerasHubConfig)
    except ValueError:
        pass  # Already registered in this process.

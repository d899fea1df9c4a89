"""What a model folder's `config.json` records of the backbone config.

The dims vLLM sizes the model and its KV cache from, read from the names each
family's backbone config uses; a digest of the whole config, so vLLM's saved
compile is keyed by every backbone setting; and the dtype the preset's
weights were saved in, which vLLM's `dtype="auto"` resolves from.
"""

import hashlib
import json

# RoPE presets do not record a context limit; this is keras-hub's own
# serving default. `max_model_len` raises or lowers it.
DEFAULT_MAX_POSITION_EMBEDDINGS = 8192


def vocab_size(backbone_config):
    """The rows of the backbone's token embedding (Gemma3n: its text's)."""
    return int(backbone_config.get("text_vocab_size") or backbone_config["vocabulary_size"])


def model_dims(backbone_config):
    """Maps a KerasHub backbone config to the dims vLLM reads.

    Multi-head configs name `num_heads`; grouped-query ones name
    `num_query_heads` (SmolLM3: `num_attention_heads`) and
    `num_key_value_heads`; Gemma and Mistral name an explicit `head_dim`.
    Gemma3n names its text dims as Hugging Face does (`text_hidden_size`,
    `num_hidden_layers`, `text_vocab_size`, `max_position_embeddings`).
    """
    if "text_hidden_size" in backbone_config:
        backbone_config = {
            **backbone_config,
            "hidden_dim": backbone_config["text_hidden_size"],
            "vocabulary_size": backbone_config["text_vocab_size"],
            "num_layers": backbone_config["num_hidden_layers"],
            "max_sequence_length": backbone_config["max_position_embeddings"],
        }
    hidden = backbone_config["hidden_dim"]
    heads = (
        backbone_config.get("num_query_heads")
        or backbone_config.get("num_attention_heads")
        or backbone_config["num_heads"]
    )
    dims = {
        "vocab_size": backbone_config["vocabulary_size"],
        "hidden_size": hidden,
        "num_hidden_layers": backbone_config["num_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": backbone_config.get("num_key_value_heads") or heads,
        "head_dim": backbone_config.get("head_dim") or hidden // heads,
        "max_position_embeddings": backbone_config.get(
            "max_sequence_length", DEFAULT_MAX_POSITION_EMBEDDINGS
        ),
    }
    return {key: int(value) for key, value in dims.items()}


def config_digest(backbone_config):
    """A digest of the whole backbone config, for `config.json`.

    vLLM keys its saved compile (`saved_compile`) by the engine config, of
    which `config.json` is part; this makes any backbone setting part of
    that key, not only the dims written beside it. The layer's name (which
    Keras numbers per process: `llama3_backbone_1`) and trainability do not
    change the computation, so they are left out.
    """
    settings = {
        key: value
        for key, value in backbone_config.items()
        if key not in ("name", "trainable")
    }
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def weights_dtype(backbone_config):
    """The dtype a preset's weights were saved in, e.g. `"bfloat16"`.

    Written as `torch_dtype`, from which vLLM's `dtype="auto"` resolves (it
    serves float32 weights in bfloat16 unless told `dtype="float32"`).
    """
    policy = backbone_config.get("dtype") or "float32"
    if isinstance(policy, dict):
        policy = policy.get("config", {}).get("name", "float32")
    return policy.removeprefix("mixed_")

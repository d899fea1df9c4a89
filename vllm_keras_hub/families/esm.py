"""ESM: its protein classifiers, attention bidirectional and rotary.

`EsmSelfAttention` is RoFormerV2's attention with ESM's own rotation
(`families/roformer_v2.py` serves the rest).
"""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.families.roformer_v2 import attend
from vllm_keras_hub.families.roformer_v2 import project
from vllm_keras_hub.layers.attention.attention_routes import Route


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # Its graph masks the pad token's id; vLLM packs none.
    return backbone({"token_ids": token_ids}, training=False)


def _cos_sin(rotary, heads, positions):
    # `ESMRotaryEmbedding._compute_cos_sin_embedding` numbers positions from
    # its input's length; here its own frequencies at vLLM's positions.
    dim = heads.shape[-1]
    inv_freq = rotary.scaling_factor / (
        rotary.max_wavelength ** (ops.arange(0, dim, 2, dtype=heads.dtype) / dim)
    )
    freqs = ops.outer(ops.cast(ops.reshape(positions, (-1,)), heads.dtype), inv_freq)
    embedding = ops.concatenate((freqs, freqs), axis=-1)
    return ops.cos(embedding)[:, None, None, :], ops.sin(embedding)[:, None, None, :]


def esm_attention(layer, hidden_states, positions):
    if not layer.use_rotary:
        # keras-hub's serving positions skip its `start_index` (the pad id).
        raise ValueError(
            "ESM presets with absolute positions (position_embedding_type="
            "'absolute') are not served; every published ESM-2 preset is rotary."
        )
    query, key, value = project(layer, hidden_states)
    rotary = layer.rotary_embedding_layer
    cos, sin = _cos_sin(rotary, query, positions)
    query = rotary.apply_rotary_pos_emb(query, cos, sin)
    key = rotary.apply_rotary_pos_emb(key, cos, sin)
    return attend(layer, query, key, value)


FAMILY = Family(
    "esm",
    "ESM",
    "ESMBackbone",
    OURS,
    embedder_only=True,
    attention={"EsmSelfAttention": Route(esm_attention)},
    text_forward=text_forward,
)

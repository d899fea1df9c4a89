"""T5Gemma's parts for `tasks/seq_2_seq_lm/`: its model folder's fields, and
how its decoder's attention and logits reach vLLM."""

from keras import ops
from keras_hub.src.vllm.context import get_vllm_context

from vllm_keras_hub.tasks.seq_2_seq_lm.fields import decoder_fields

# The lengths the published presets' preprocessor packs, where it records none.
_ENCODER_LENGTH = 512
_DECODER_LENGTH = 512


def config_fields(preset, backbone_config, tokenizer):
    """`(dims, fields)`: vLLM's dims, and the task's fields.

    The preprocessor's `generate_preprocess` packs the encoder's text with
    the start token only where `add_start_token` (no end token), and the
    decoder's prompt as the start token, vLLM's decoder start. Its rotary
    positions bound nothing: the longest texts are the lengths its
    preprocessor packs.
    """
    config = backbone_config
    preprocessor = preset.preprocessor_config
    layers = config["decoder_num_layers"]
    window = config.get("sliding_window")
    dims = {
        "vocab_size": int(config["vocabulary_size"]),
        "hidden_size": int(config["decoder_hidden_dim"]),
        "num_hidden_layers": int(layers),
        "num_attention_heads": int(config["decoder_num_attention_heads"]),
        "num_key_value_heads": int(config["decoder_num_key_value_heads"]),
        "head_dim": int(config["decoder_head_dim"]),
        "max_position_embeddings": int(
            preprocessor.get("decoder_sequence_length") or _DECODER_LENGTH
        ),
    }
    fields = decoder_fields(
        num_layers=layers,
        num_heads=config["decoder_num_attention_heads"],
        num_kv_heads=config["decoder_num_key_value_heads"],
        head_size=config["decoder_head_dim"],
        hidden_dim=config["decoder_hidden_dim"],
        scale=config.get("query_pre_attn_scalar", 1.0) ** -0.5,
        soft_cap=config.get("attn_logit_softcapping"),
        # Its mask lets a query see `sliding_window` tokens before it.
        sliding_windows=[
            window + 1 if kind == "sliding_attention" else None
            for kind in config["decoder_layer_types"]
        ],
        max_encoder_tokens=preprocessor.get("encoder_sequence_length") or _ENCODER_LENGTH,
        tokenizer=tokenizer,
        encoder_start=bool(preprocessor.get("add_start_token", False)),
        encoder_end=False,
        decoder_start_token_id=tokenizer.start_token_id,
        decoder_prompt=[tokenizer.start_token_id],
    )
    return dims, fields


def self_attention_call(self, inputs, attention_mask=None, cache=None, cache_update_index=None,
                        training=None):  # fmt: skip
    """`T5GemmaAttention.call` on self-attention, on the layer's vLLM
    `Attention`: its own projections, rotary at vLLM's per-token positions,
    scale, soft cap and sliding window (the kernel's)."""
    from vllm_keras_hub.tasks.seq_2_seq_lm.model import attend

    positions = ops.reshape(get_vllm_context().positions, (-1, 1))
    query = self.rotary_embedding(self.query_dense(inputs), positions=positions)
    key = self.rotary_embedding(self.key_dense(inputs), positions=positions)
    output = attend(self, self._vllm_attention, query, key, self.value_dense(inputs))
    # Its decoder layer unpacks `(output, cache)`; vLLM keeps the cache.
    return output, output


def cross_attention_call(self, inputs, attention_mask=None, cache=None, cache_update_index=None,
                         training=None):  # fmt: skip
    """`T5GemmaAttention.call` on cross-attention, on the layer's vLLM `CrossAttention`."""
    from vllm_keras_hub.tasks.seq_2_seq_lm.model import cross_attend

    hidden_states, encoder = inputs
    output = cross_attend(self, hidden_states, encoder, encoder)
    return output, output


def decoder_embedding(backbone):
    return backbone.decoder_token_embedding


def logits(backbone, hidden_states):
    """As `T5GemmaSeq2SeqLM` computes them: its decoder embedding, reversed,
    then `tanh(logits / cap)`. (keras-hub 0.32 leaves out the `* cap` that
    Gemma's soft cap has: greedy tokens are the same; sampling is at the
    task's own logits, as it samples.)"""
    logits = backbone.decoder_token_embedding(hidden_states, reverse=True)
    cap = backbone.final_logit_softcapping
    if cap is not None:
        logits = ops.tanh(logits / cap)
    return logits

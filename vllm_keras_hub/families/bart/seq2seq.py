"""BART's parts for `tasks/seq_2_seq_lm/`: its model folder's fields, and
how its decoder's attention reaches vLLM."""

from vllm_keras_hub.export.backbone_fields import model_dims
from vllm_keras_hub.tasks.seq_2_seq_lm.fields import decoder_fields


def config_fields(preset, backbone_config, tokenizer):
    """`(dims, fields)`: vLLM's dims, and the task's fields.

    The preprocessor packs the encoder's text `<s> text </s>`, and the
    decoder's prompt `</s> <s>`: vLLM's decoder start token (BART's end
    token), then the start token.
    """
    dims = model_dims(backbone_config)
    fields = decoder_fields(
        num_layers=dims["num_hidden_layers"],
        num_heads=dims["num_attention_heads"],
        head_size=dims["head_dim"],
        hidden_dim=dims["hidden_size"],
        # The encoder's learned positions bound its text.
        max_encoder_tokens=dims["max_position_embeddings"],
        tokenizer=tokenizer,
        encoder_start=True,
        encoder_end=True,
        decoder_start_token_id=tokenizer.end_token_id,
        decoder_prompt=[tokenizer.start_token_id],
    )
    return dims, fields


def self_attention_call(self, query, value, key=None, attention_mask=None, cache=None,
                        cache_update_index=None, return_attention_scores=False, training=None):  # fmt: skip
    """`CachedMultiHeadAttention.call`, on the layer's vLLM `Attention`."""
    from vllm_keras_hub.tasks.seq_2_seq_lm.model import attend

    # vLLM's kernel masks causally over the paged cache: the mask the
    # decoder layer made for its own dense path is not needed.
    return attend(
        self, self._vllm_attention,
        self._query_dense(query), self._key_dense(value), self._value_dense(value),
    )  # fmt: skip


def cross_attention_call(self, query, value, key=None, attention_mask=None, cache=None,
                         cache_update_index=None, return_attention_scores=False, training=None):  # fmt: skip
    """`CachedMultiHeadAttention.call`, on the layer's vLLM `CrossAttention`."""
    from vllm_keras_hub.tasks.seq_2_seq_lm.model import cross_attend

    return cross_attend(self, query, value, value)


def decoder_embedding(backbone):
    """The decoder's token embedding, tied to its logits."""
    return backbone.token_embedding


def logits(backbone, hidden_states):
    return backbone.token_embedding(hidden_states, reverse=True)

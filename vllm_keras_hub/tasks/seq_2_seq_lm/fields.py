"""The task's `config.json` fields, as each family's `seq2seq` part fills them."""


def decoder_fields(*, num_layers, num_heads, head_size, hidden_dim, max_encoder_tokens,
                   tokenizer, encoder_start, encoder_end, decoder_start_token_id,
                   decoder_prompt, num_kv_heads=None, scale=None, soft_cap=None,
                   sliding_windows=None):  # fmt: skip
    """The fields the processor, renderer and model class read.

    Args:
        num_layers, num_heads, head_size, hidden_dim: The decoder's.
        max_encoder_tokens: The longest packed encoder text.
        tokenizer: The preset's tokenizer.
        encoder_start, encoder_end: Whether the preprocessor packs the
            start and end tokens around the encoder's text.
        decoder_start_token_id: What vLLM starts every decoder prompt with.
        decoder_prompt: The preprocessor's empty decoder prompt, after it.
        num_kv_heads: The decoder's key/value heads (`num_heads` if `None`).
        scale: The attention's softmax scale (`head_size ** -0.5` if `None`).
        soft_cap: Its attention-logit soft cap, or `None`.
        sliding_windows: Per decoder layer, the tokens each query sees (itself
            included), or `None` for all.
    """
    return {
        "num_layers": int(num_layers),
        "num_heads": int(num_heads),
        "num_kv_heads": int(num_kv_heads or num_heads),
        "head_size": int(head_size),
        "hidden_dim": int(hidden_dim),
        "scale": float(scale if scale is not None else head_size**-0.5),
        "soft_cap": None if soft_cap is None else float(soft_cap),
        "sliding_windows": list(sliding_windows or [None] * int(num_layers)),
        "max_encoder_tokens": int(max_encoder_tokens),
        "start_token_id": tokenizer.start_token_id,
        "end_token_id": tokenizer.end_token_id,
        "encoder_start": bool(encoder_start),
        "encoder_end": bool(encoder_end),
        "decoder_start_token_id": int(decoder_start_token_id),
        "decoder_prompt": [int(i) for i in decoder_prompt],
    }

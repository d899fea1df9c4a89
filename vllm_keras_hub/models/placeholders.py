"""Media placeholders expanded in a prompt's token ids as KerasHub does.

vLLM's multimodal processor (`multimodal.py`) tokenizes the prompt first and
expands each item's placeholder token after; KerasHub's preprocessors
expand the placeholder in the text and tokenize the result. These give the
same ids.
"""


def soft_token(media):
    """The soft token of an image, audio or video format, and the most
    tokens an item takes."""
    if "video_token" in media:
        return media["video_token"], media["tokens_per_video"]
    if "audio_token" in media:
        return media["audio_token"], media["tokens_per_clip"]
    return media["image_token"], media["tokens_per_image"]


def media_span(vocab, media, count=None):
    """The token ids one item's placeholder expands to, newlines aside.

    Args:
        vocab: The tokenizer's vocabulary.
        media: An image or audio format.
        count: The item's soft tokens, where they vary by item (Gemma4's
            clips); by default the format's count.
    """
    token, most = soft_token(media)
    count = most if count is None else count
    # Qwen3.5's prompt writes the markers around its placeholder itself.
    markers = [[vocab[media[end]]] if media[end] else [] for end in ("start_token", "end_token")]
    return markers[0] + [vocab[token]] * count + markers[1]


def expand_placeholders(token_ids, tokenizer, spans):
    """The prompt's ids with each media placeholder expanded as KerasHub does.

    KerasHub replaces each placeholder in the prompt's text, then tokenizes
    the result whole (e.g. `Gemma3CausalLMPreprocessor`), so the expansion's
    newlines merge with the text around them. Special tokens are split
    points of both tokenizers, so each stretch of text between two of them
    is decoded, given its newlines and encoded again, and special tokens
    (the start token, turn markers) are kept as they are. Without newlines
    (Gemma4), the text is left as it was tokenized.

    Args:
        token_ids: The prompt's token ids.
        tokenizer: vLLM's tokenizer of the preset.
        spans: For each placeholder's token id, each item's `(before, ids,
            after)`, in the order the prompt's placeholders take them:
            its span's ids (`media_span`, `video.video_span`), and the text
            KerasHub writes around them (the format's newlines; a video's
            first timestamp).

    Returns:
        The expanded token ids.

    Raises:
        ValueError: the prompt has more placeholders of a modality than
            items of it.
    """
    unused = {token: iter(items) for token, items in spans.items()}

    def span(token):
        item = next(unused[token], None)
        if item is None:
            placeholder = tokenizer.decode([token])
            raise ValueError(
                f"The prompt has more {placeholder} placeholders than the "
                f"request's {len(spans[token])} item(s) of that kind."
            )
        return item

    if not any(before or after for items in spans.values() for before, _, after in items):
        new_ids = []
        for token in token_ids:
            new_ids += span(token)[1] if token in spans else [token]
        return new_ids
    atomic = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pieces, run = [], []
    for token in [*token_ids, None]:
        if token is not None and token not in atomic:
            run.append(token)
            continue
        if run:
            pieces.append(tokenizer.decode(run, skip_special_tokens=False))
            run = []
        if token in spans:
            pieces += list(span(token))
        elif token is not None:
            pieces.append([token])
    new_ids, text = [], ""
    for piece in [*pieces, []]:
        if isinstance(piece, str):
            text += piece
            continue
        if text:
            new_ids += tokenizer.encode(text, add_special_tokens=False)
            text = ""
        new_ids += piece
    return new_ids

"""Tiny, deterministic tokenizers of every routed family, for tests.

The assets are learned in memory from a small English-ish corpus: a byte-level
BPE vocabulary (all 256 byte symbols plus a few hundred merges) for the
GPT-2-style families, and SentencePiece BPE models (byte fallback, split
digits) laid out like Gemma's or Llama's for the SentencePiece families. Each
is built once per process and takes well under a second.
"""

import functools
import io

# Text the tiny vocabularies are learned from. Kept small so learning is fast;
# varied enough that merges span words, whitespace runs and punctuation.
_TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer turns text into a sequence of integer ids.",
    "Keras runs the same model on JAX, TensorFlow and PyTorch.",
    "Serving a language model means batching requests and caching keys.",
    "the cat sat on the mat, and the dog sat on the log.",
    "There is no place like home; there is no time like the present.",
    "We don't know what they'll say, but I'll tell you when it's done.",
    "She said: \"Hello, world!\" and then left the room.",
    "In 2024 the model had 7 billion parameters and 32 layers.",
    "def main():\n    print('hello')\n    return 0\n",
    "Numbers like 3.14159, 2.71828 and 1,000,000 appear in text.",
    "  Leading spaces, trailing spaces  and  double  spaces.  ",
    "Tabs\tseparate\tcolumns\tin\tthis\tline.",
    "Lines end with newlines\nand sometimes with two\n\nnewlines.",
    "Café, naïve, résumé and jalapeño are words with accents.",
    "The rain in Spain stays mainly in the plain.",
    "To be, or not to be: that is the question.",
    "All happy families are alike; each unhappy family is unhappy in its "
    "own way.",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael. Some years ago, never mind how long precisely.",
    "the the the and and and of of of to to to in in in is is is",
    "information, transformation, tokenization, normalization, generation",
    "running, jumping, swimming, reading, writing, thinking, serving",
    "    indented code block\n        more indented\n",
)

# Strings every exported tokenizer must agree with KerasHub on.
TOKENIZER_CORPUS = (
    "",
    " ",
    "  ",
    "\n",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "hello world",
    " hello world ",
    "   leading and trailing   ",
    "multiple    spaces   between     words",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings\r\n",
    "mixed \t\n \r\n whitespace \n\t ",
    "don't, I'll, we've, they're, she'd, it's, I'm",
    "DON'T SHOUT, I'LL LISTEN",
    "1234567890 and 3.14159 and 1,000,000 and 007",
    "Numbers: 12345678901234567890",
    "Café naïve résumé jalapeño Ångström",
    "Ünïcödé àccents ça va? Où est-ce?",
    "Emoji: 😀🎉👍🏽 and 🇺🇸 flags",
    "日本語のテキストと中文文本",
    "한국어 텍스트",
    "Русский текст и English text",
    "مرحبا بالعالم",
    "Mixed: abc123def, x=y+z; a<b>c & d|e",
    "Punctuation!!! ??? ... --- *** ### @@@ $$$ %%%",
    "def f(x):\n    return x * 2  # comment\n",
    '{"key": "value", "list": [1, 2, 3]}',
    "<|endoftext|>",
    "text <|endoftext|> more text",
    "<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<s>Hello</s> <s> </s>",
    "<bos>Hi<eos><pad><unk>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_image><img><end_of_image> caption",
    "almost special: <|endoftext| <bos <s",
    "\u00a0non-breaking\u2009thin\u202fnarrow\u3000ideographic spaces",
    "zero\u200bwidth and soft\u00adhyphen",
    "▁metaspace▁character▁in▁text",
    "ĠĊ byte level look-alikes ĉ",
    "a" * 40,
    "ab " * 20,
    "the the the the the",
)

# Byte-level BPE special tokens of each family, in vocabulary order.
_BPE_SPECIAL_TOKENS = {
    "gpt2": ("<|endoftext|>",),
    "opt": ("<s>", "<pad>", "</s>", "<unk>"),
    "llama3": (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ),
    "qwen": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen_moe": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3_moe": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3_5": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "qwen3_5_moe": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "bloom": ("<s>", "</s>", "<pad>"),
    "falcon": ("<|endoftext|>",),
    "gpt_neox": ("<|endoftext|>",),
    "gpt_oss": ("<|endoftext|>",),
    "smollm3": (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
    ),
}

# SentencePiece id layouts: the reserved pieces and where they sit.
_SENTENCEPIECE_LAYOUTS = {
    "gemma": dict(
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        add_dummy_prefix=False,
    ),
    "llama": dict(
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        unk_piece="<unk>",
        bos_piece="<s>",
        eos_piece="</s>",
        add_dummy_prefix=True,
    ),
}

_GEMMA3_SYMBOLS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<img>",
    "<start_of_image>",
    "<end_of_image>",
)

# Gemma3nTokenizer checks all of these are in the vocabulary. As in the
# published vocabulary, `<end_of_image>` comes right before the image soft
# token (Gemma3n's vision vocabulary starts at it) and `<end_of_audio>`
# right before the audio soft token.
_GEMMA3N_SYMBOLS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<start_of_audio>",
    "<end_of_image>",
    "<image_soft_token>",
    "<end_of_audio>",
    "<audio_soft_token>",
    "<mask>",
    "[multimodal]",
)

# Gemma 4's turn pieces; its text-only tokenizer needs no others.
_GEMMA4_SYMBOLS = ("<|turn>", "<turn|>")
# Its image pieces and the video placeholder, which a tokenizer with vision
# tokens registers too.
_GEMMA4_VISION_SYMBOLS = ("<|image>", "<|image|>", "<image|>", "<|video|>")
# Its audio pieces, for a preset with an audio encoder.
_GEMMA4_AUDIO_SYMBOLS = ("<|audio>", "<|audio|>", "<audio|>")

# The tool-calling and thinking tokens of the published vocabularies, for
# chat presets (`make_tokenizer(..., chat=True)`): Qwen3's and GPT-OSS's
# added tokens, unsplittable as an `hf://` conversion lists them, and Gemma
# 4's pieces.
_QWEN3_CHAT_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHAT_TOKENS = {
    "qwen": ("<tool_call>", "</tool_call>"),
    "qwen3": _QWEN3_CHAT_TOKENS,
    "qwen3_5": _QWEN3_CHAT_TOKENS,
    "llama3": ("<|python_tag|>", "<|eom_id|>"),
    "smollm3": (),
    "gpt_oss": (
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    ),
    "gemma4": (
        "<|tool>",
        "<tool|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
        '<|"|>',
        "<|channel>",
        "<channel|>",
        "<|think|>",
    ),
}

_PHI3_SYMBOLS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>")

FAMILIES = (
    "gpt2",
    "opt",
    "llama3",
    "qwen",
    "qwen3",
    "gemma",
    "gemma3",
    "gemma3n",
    "gemma4",
    "llama",
    "mistral",
    "mixtral",
    "qwen_moe",
    "qwen3_moe",
    "smollm3",
    "bloom",
    "falcon",
    "gpt_neox",
    "gpt_oss",
)


def _bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map, in id order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return dict(zip(printable, (chr(c) for c in chars)))


@functools.lru_cache(maxsize=None)
def _learned_bpe(num_merges):
    import regex

    byte_map = _bytes_to_unicode()
    pattern = regex.compile(
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
        r"|\s+(?!\S)|\s+"
    )
    counts = {}
    for line in _TRAINING_TEXT:
        for word in pattern.findall(line):
            symbols = tuple(byte_map[b] for b in word.encode("utf-8"))
            counts[symbols] = counts.get(symbols, 0) + 1

    merges = []
    for _ in range(num_merges):
        pairs = {}
        for symbols, count in counts.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        # Ties go to the lexicographically smallest pair, for determinism.
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        merged = {}
        for symbols, count in counts.items():
            out = []
            i = 0
            while i < len(symbols):
                if symbols[i : i + 2] == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        counts = merged
    return tuple(byte_map[b] for b in range(256)), tuple(merges)


def tiny_bpe_vocabulary_and_merges(special_tokens=(), num_merges=250):
    """A tiny byte-level BPE vocabulary and its merges.

    Args:
        special_tokens: Strings appended to the vocabulary after the learned
            tokens, in order.
        num_merges: How many merges to learn; the vocabulary has 256 byte
            symbols, one token per merge and the special tokens.

    Returns:
        `(vocabulary, merges)`: a dict from token to id, and a list of
        `"left right"` merge rules in priority order.
    """
    byte_symbols, merges = _learned_bpe(num_merges)
    vocabulary = {symbol: i for i, symbol in enumerate(byte_symbols)}
    for left, right in merges:
        vocabulary.setdefault(left + right, len(vocabulary))
    for token in special_tokens:
        vocabulary.setdefault(token, len(vocabulary))
    return vocabulary, [f"{left} {right}" for left, right in merges]


@functools.lru_cache(maxsize=None)
def tiny_sentencepiece_proto(
    vocab_size=600, layout="gemma", user_defined_symbols=()
):
    """A tiny SentencePiece BPE model, serialized.

    Trained like Gemma's and Llama's models: BPE, byte fallback, identity
    normalization, split digits, whitespace-only pieces, extra whitespace
    kept.

    Args:
        vocab_size: Total pieces, including the 256 byte pieces.
        layout: `"gemma"` (`<pad>`=0, `<eos>`=1, `<bos>`=2, `<unk>`=3, no
            dummy prefix) or `"llama"` (`<unk>`=0, `<s>`=1, `</s>`=2, dummy
            prefix).
        user_defined_symbols: Tuple of pieces that are always matched whole
            in text, e.g. Gemma's `<start_of_turn>`.

    Returns:
        The serialized model proto, as `bytes`.
    """
    import sentencepiece

    if layout not in _SENTENCEPIECE_LAYOUTS:
        raise ValueError(
            f"Unknown layout {layout!r}; expected one of "
            f"{sorted(_SENTENCEPIECE_LAYOUTS)}."
        )
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_TRAINING_TEXT),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        character_coverage=1.0,
        user_defined_symbols=list(user_defined_symbols),
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        **_SENTENCEPIECE_LAYOUTS[layout],
    )
    return model.getvalue()


# Qwen3.5's vision tokens, for presets served with images.
QWEN3_5_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def make_tokenizer(family, images=False, chat=False, audio=False):
    """A KerasHub tokenizer of `family` built from the tiny assets.

    Args:
        family: One of `FAMILIES`, or `"phi3"`.
        images: With the family's image tokens, where its text tokenizer
            has none (Gemma4, Qwen3.5).
        chat: With the family's tool-calling and thinking tokens
            (`CHAT_TOKENS`).
        audio: With the family's audio tokens, where its image tokenizer
            has none (Gemma4).

    Returns:
        A `keras_hub.tokenizers.Tokenizer` of the family's own class.
    """
    import keras_hub

    bpe_classes = {
        "gpt2": keras_hub.tokenizers.GPT2Tokenizer,
        "opt": keras_hub.tokenizers.OPTTokenizer,
        "llama3": keras_hub.tokenizers.Llama3Tokenizer,
        "qwen": keras_hub.tokenizers.QwenTokenizer,
        "qwen3": keras_hub.tokenizers.Qwen3Tokenizer,
        "qwen_moe": keras_hub.tokenizers.QwenMoeTokenizer,
        "qwen3_moe": keras_hub.tokenizers.Qwen3MoeTokenizer,
        # Text presets: no image and video tokens in the tiny vocabulary.
        "qwen3_5": functools.partial(
            keras_hub.tokenizers.Qwen3_5Tokenizer, has_vision_tokens=False
        ),
        "qwen3_5_moe": functools.partial(
            keras_hub.tokenizers.Qwen3_5MoeTokenizer, has_vision_tokens=False
        ),
        "smollm3": keras_hub.tokenizers.SmolLM3Tokenizer,
        "bloom": keras_hub.tokenizers.BloomTokenizer,
        "falcon": keras_hub.tokenizers.FalconTokenizer,
        "gpt_neox": keras_hub.tokenizers.GPTNeoXTokenizer,
        "gpt_oss": keras_hub.tokenizers.GptOssTokenizer,
    }
    chat_tokens = CHAT_TOKENS[family] if chat else ()
    if family == "qwen3_5" and images:
        bpe_classes[family] = keras_hub.tokenizers.Qwen3_5Tokenizer
        chat_tokens += QWEN3_5_VISION_TOKENS
    if family in bpe_classes:
        special_tokens = _BPE_SPECIAL_TOKENS[family] + chat_tokens
        vocabulary, merges = tiny_bpe_vocabulary_and_merges(special_tokens)
        kwargs = {"unsplittable_tokens": list(special_tokens)} if chat_tokens else {}
        return bpe_classes[family](vocabulary=vocabulary, merges=merges, **kwargs)
    if family == "gemma":
        proto = tiny_sentencepiece_proto(
            layout="gemma", user_defined_symbols=_GEMMA3_SYMBOLS[:2]
        )
        return keras_hub.tokenizers.GemmaTokenizer(proto=proto)
    if family == "gemma3":
        proto = tiny_sentencepiece_proto(
            layout="gemma", user_defined_symbols=_GEMMA3_SYMBOLS
        )
        return keras_hub.tokenizers.Gemma3Tokenizer(proto=proto)
    if family == "gemma3n":
        proto = tiny_sentencepiece_proto(
            layout="gemma", user_defined_symbols=_GEMMA3N_SYMBOLS
        )
        return keras_hub.tokenizers.Gemma3nTokenizer(proto=proto)
    if family == "gemma4":
        symbols = _GEMMA4_SYMBOLS + (_GEMMA4_VISION_SYMBOLS if images else ())
        symbols += (_GEMMA4_AUDIO_SYMBOLS if audio else ()) + chat_tokens
        proto = tiny_sentencepiece_proto(layout="gemma", user_defined_symbols=symbols)
        return keras_hub.tokenizers.Gemma4Tokenizer(
            proto=proto,
            has_vision_tokens=images,
            has_audio_tokens=audio,
            has_video_tokens=images,
        )
    if family == "llama":
        proto = tiny_sentencepiece_proto(layout="llama")
        return keras_hub.tokenizers.LlamaTokenizer(proto=proto)
    if family == "mistral":
        proto = tiny_sentencepiece_proto(layout="llama")
        return keras_hub.tokenizers.MistralTokenizer(proto=proto)
    if family == "phi3":
        # Not in FAMILIES (the exportable ones): a dummy prefix with
        # user-defined pieces cannot be exported exactly, so Phi-3 is served
        # with KerasHub's own tokenizer.
        proto = tiny_sentencepiece_proto(
            layout="llama", user_defined_symbols=_PHI3_SYMBOLS
        )
        return keras_hub.tokenizers.Phi3Tokenizer(proto=proto)
    if family == "mixtral":
        proto = tiny_sentencepiece_proto(layout="llama")
        return keras_hub.tokenizers.MixtralTokenizer(proto=proto)
    raise ValueError(f"Unknown family {family!r}; expected one of {FAMILIES}.")


def permuted_preset(preset, directory, first=300, second=301):
    """A copy of a byte-level BPE preset whose tokens at two ids are swapped.

    The same tokens, merges and weights: only the ids of the two tokens
    differ, so every token of the vocabulary is still in it.

    Args:
        preset: A preset folder of a byte-level BPE family.
        directory: Where to save the copy.
        first: One id to swap.
        second: The other.

    Returns:
        `directory`.
    """
    import shutil

    import keras_hub

    shutil.copytree(preset, directory)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    by_id = {index: token for token, index in tokenizer.vocabulary.items()}
    vocabulary = dict(tokenizer.vocabulary)
    vocabulary[by_id[first]], vocabulary[by_id[second]] = second, first
    config = tokenizer.get_config()
    config.update(vocabulary=vocabulary, merges=tokenizer.merges)
    type(tokenizer).from_config(config).save_to_preset(directory)
    return directory

"""Tiny random-weight `TextEmbedder` presets, for tests.

Each is a real KerasHub text embedder (backbone, preprocessor, tokenizer)
saved with `save_to_preset`, on the tiny backbones of `presets.py`: 2 layers,
head size 32, and a sliding window shorter than the test texts.
"""

import os

import keras
import keras_hub

from vllm_keras_hub.testing.presets import backbone_kwargs
from vllm_keras_hub.testing.tokenizers import make_tokenizer

# name -> (TextEmbedder class, tiny family, backbone extras, embedder kwargs)
TINY_EMBEDDERS = {
    # EmbeddingGemma's form: bidirectional attention, and the mean pooling,
    # two projections and normalization inside the backbone. Served up to
    # 32 tokens, half its window (`export/embedder.py`); 256 wide, so it has
    # a smaller Matryoshka dimension (128).
    "embedding_gemma": (
        "Gemma3TextEmbedder",
        "gemma3",
        dict(
            use_bidirectional_attention=True,
            is_embedding_model=True,
            pooling_intermediate_dim=96,
            embedding_dim=256,
            sliding_window_size=64,
        ),
        {},
    ),
    # `harrier_embedding_oss_270m`'s form: a causal Gemma3, last token.
    "gemma3_last": ("Gemma3TextEmbedder", "gemma3", {}, dict(pooling_mode="last")),
    # `qwen3_embedding_*`: causal Qwen3, last token (its `<|im_end|>`).
    "qwen3_last": ("Qwen3TextEmbedder", "qwen3", {}, dict(pooling_mode="last")),
    # Mean pooling, not normalized.
    "qwen3_mean": (
        "Qwen3TextEmbedder",
        "qwen3",
        {},
        dict(pooling_mode="mean", normalize=False),
    ),
    # Encoders (`_ENCODERS`): sentence-transformers' MiniLM form (BERT, mean
    # pooling), and XLM-RoBERTa with the first token's state (`cls`).
    "bert_mean": ("BertTextEmbedder", "bert", {}, {}),
    "xlm_roberta_cls": ("XLMRobertaTextEmbedder", "xlm_roberta", {}, dict(pooling_mode="cls")),
}

_ENCODER = dict(
    num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=256, max_sequence_length=64
)
# The tiny WordPiece vocabulary of a sentence-transformers BERT checkpoint:
# the tiny test vocabulary, and pieces of accent-stripped words.
BERT_EXTRA_PIECES = ("cafe", "cr", "##eme", "²", "2", "≤", "日", "本")
# The tiny BERT vocabulary: specials, punctuation, letters alone and as
# word pieces (so every lowercase word tokenizes), and whole test words.
_WORDPIECE_VOCABULARY = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + list(".,?!'")
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    + "the quick brown fox jumps over lazy dog mars is red which planet hi".split()
)


def encoder_tokenizer(family):
    """The tiny tokenizer of encoder `family`: `"bert"`, `"distil_bert"`,
    `"roberta"`, `"xlm_roberta"` or `"albert"`."""
    from vllm_keras_hub.testing.tokenizers import tiny_bpe_vocabulary_and_merges
    from vllm_keras_hub.testing.tokenizers import tiny_sentencepiece_proto

    if family == "bert":
        return keras_hub.tokenizers.BertTokenizer(vocabulary=_WORDPIECE_VOCABULARY)
    if family == "distil_bert":
        return keras_hub.tokenizers.DistilBertTokenizer(vocabulary=_WORDPIECE_VOCABULARY)
    if family == "roformer_v2":
        return keras_hub.tokenizers.RoformerV2Tokenizer(vocabulary=_WORDPIECE_VOCABULARY)
    if family == "esm":
        # ESM-2's specials, in its order; cased letters, as it keeps case.
        letters = [chr(c) for c in (*range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1))]
        vocabulary = ["<cls>", "<pad>", "<eos>", "<unk>", "<mask>", *".,?!'", *letters]
        return keras_hub.tokenizers.ESMTokenizer(
            vocabulary=vocabulary + ["##" + letter for letter in letters]
        )
    if family == "roberta":
        # With transformers' `<unk>`, which its RoBERTa tokenizer adds.
        specials = ("<s>", "<pad>", "</s>", "<mask>", "<unk>")
        vocabulary, merges = tiny_bpe_vocabulary_and_merges(specials)
        return keras_hub.tokenizers.RobertaTokenizer(vocabulary=vocabulary, merges=merges)
    if family == "albert":
        return keras_hub.tokenizers.AlbertTokenizer(
            proto=tiny_sentencepiece_proto(user_defined_symbols=("[CLS]", "[SEP]", "[MASK]"))
        )
    return keras_hub.tokenizers.XLMRobertaTokenizer(
        proto=tiny_sentencepiece_proto(layout="llama")
    )


def build_tiny_embedder(name, directory, seed=0):
    """Saves the tiny random-weight embedder `name` into `directory`.

    Args:
        name: A key of `TINY_EMBEDDERS`.
        directory: Where to save; created if missing.
        seed: Weight initialisation seed.

    Returns:
        `directory`.
    """
    embedder_name, family, extras, options = TINY_EMBEDDERS[name]
    keras.utils.set_random_seed(seed)
    packing = {}
    if family in ("bert", "xlm_roberta"):
        tokenizer = encoder_tokenizer(family)
        kwargs = {**_ENCODER, "vocabulary_size": tokenizer.vocabulary_size()}
        # Packed no longer than its position table (256 by default).
        packing = dict(sequence_length=_ENCODER["max_sequence_length"])
    else:
        tokenizer = make_tokenizer(family)
        kwargs = {**backbone_kwargs(family, tokenizer.vocabulary_size()), **extras}
    embedder_cls = getattr(keras_hub.models, embedder_name)
    backbone = embedder_cls.backbone_cls(**kwargs)
    preprocessor = embedder_cls.preprocessor_cls(tokenizer=tokenizer, **packing)
    embedder = embedder_cls(backbone=backbone, preprocessor=preprocessor, **options)
    os.makedirs(directory, exist_ok=True)
    embedder.save_to_preset(directory)
    return directory


def keras_hub_embeddings(preset, texts, token_ids=None):
    """The preset's own embeddings of `texts`, and each text's token count.

    What `TextEmbedder.encode_text(texts)` computes: its preprocessor packs
    the texts (start, end and pad tokens), the task model maps them to
    embeddings. `encode_text` itself batches through `predict()`, whose
    input pipeline needs `grain` or TensorFlow (neither is installed here),
    so the two steps are called directly.

    Args:
        preset: The embedder's preset.
        texts: The texts.
        token_ids: Each text's ids to feed the model instead of its
            preprocessor's (a checkpoint's own tokenizer's), or `None`.

    Returns:
        `(embeddings, token_counts)`: a `(len(texts), size)` float64 array
        and a list of ints.
    """
    import numpy as np

    embedder = keras_hub.models.TextEmbedder.from_preset(preset)
    if token_ids is None:
        inputs = embedder.preprocessor(texts)
        embeddings = keras.ops.convert_to_numpy(embedder(inputs, training=False))
        counts = keras.ops.convert_to_numpy(inputs["padding_mask"]).sum(axis=1)
        return embeddings.astype("float64"), [int(count) for count in counts]
    # One text at a time, unpadded; segment 0, as the preprocessor packs one.
    keys = embedder.preprocessor(texts[:1]).keys()
    rows = []
    for ids in token_ids:
        ids = np.array([ids], dtype="int32")
        inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
        if "segment_ids" in keys:
            inputs["segment_ids"] = np.zeros_like(ids)
        rows.append(keras.ops.convert_to_numpy(embedder(inputs, training=False))[0])
    return np.array(rows, dtype="float64"), [len(ids) for ids in token_ids]

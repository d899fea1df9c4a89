"""Tiny random-weight `TextClassifier` presets, and their own predictions.

Each is a real KerasHub text classifier (backbone, head, preprocessor,
tokenizer) saved with `save_to_preset`, on the tiny encoders of
`embedders.py`: 2 layers, head size 32.
"""

import os

import keras
import keras_hub
import numpy as np

from vllm_keras_hub.testing import embedders
from vllm_keras_hub.testing.embedders import encoder_tokenizer

# name -> (TextClassifier class, encoder family, classifier kwargs)
TINY_CLASSIFIERS = {
    # Logits, as `BertTextClassifier` predicts by default; three classes.
    "bert": ("BertTextClassifier", "bert", dict(num_classes=3)),
    # Probabilities: the preset's own softmax.
    "xlm_roberta_softmax": (
        "XLMRobertaTextClassifier",
        "xlm_roberta",
        dict(num_classes=4, activation="softmax"),
    ),
    # Independent labels: a sigmoid over each.
    "bert_sigmoid": ("BertTextClassifier", "bert", dict(num_classes=2, activation="sigmoid")),
    # RoBERTa (byte-level BPE) and DistilBERT (a relu head), two classes.
    "roberta": ("RobertaTextClassifier", "roberta", dict(num_classes=2)),
    "distil_bert": ("DistilBertTextClassifier", "distil_bert", dict(num_classes=2)),
    # ALBERT (SentencePiece): its one shared layer called twice.
    "albert": ("AlbertTextClassifier", "albert", dict(num_classes=3)),
    # RoFormerV2: rotary attention, no biases, its norms without scales.
    "roformer_v2": ("RoformerV2TextClassifier", "roformer_v2", dict(num_classes=2)),
    # ESM: rotary attention, its pad token in the vocabulary's second row.
    "esm": ("ESMProteinClassifier", "esm", dict(num_classes=3)),
    # Cross-encoders, scoring text pairs: one logit, BERT's pairs in two
    # segments; a sigmoid of XLM-RoBERTa's, whose pairs are one segment.
    "bert_cross_encoder": ("BertTextClassifier", "bert", dict(num_classes=1)),
    "xlm_roberta_cross_encoder": (
        "XLMRobertaTextClassifier",
        "xlm_roberta",
        dict(num_classes=1, activation="sigmoid"),
    ),
}

# Backbone arguments beyond the tiny encoders' shape (`None`: one it has not).
_BACKBONE_EXTRAS = {
    "albert": dict(embedding_dim=64, num_groups=1),
    "roformer_v2": dict(head_size=32, max_sequence_length=None),
    "esm": dict(pad_token_id=1),
}

# Weights redrawn with this spread, where the initializer's leave every
# text's first-token state nearly the same (RoFormerV2's).
_REDRAW = {"roformer_v2": 0.15}

# Shorter than the position table: the longest text served.
SEQUENCE_LENGTH = 48


def build_tiny_classifier(name, directory, seed=0):
    """Saves the tiny random-weight classifier `name` into `directory`.

    Args:
        name: A key of `TINY_CLASSIFIERS`.
        directory: Where to save; created if missing.
        seed: Weight initialisation seed.

    Returns:
        `directory`.
    """
    classifier_name, family, options = TINY_CLASSIFIERS[name]
    keras.utils.set_random_seed(seed)
    tokenizer = encoder_tokenizer(family)
    classifier_cls = getattr(keras_hub.models, classifier_name)
    shape = {**embedders._ENCODER, **_BACKBONE_EXTRAS.get(family, {})}
    backbone = classifier_cls.backbone_cls(
        **{key: value for key, value in shape.items() if value is not None},
        vocabulary_size=tokenizer.vocabulary_size(),
    )
    if family in _REDRAW:
        rng = np.random.default_rng(seed)
        for variable in backbone.weights:
            variable.assign(rng.normal(0, _REDRAW[family], variable.shape).astype(variable.dtype))
    preprocessor = classifier_cls.preprocessor_cls(
        tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    classifier = classifier_cls(backbone=backbone, preprocessor=preprocessor, **options)
    # A tiny random encoder's first-token states differ little between
    # texts: a larger output layer spreads their outputs apart.
    logits = classifier.get_layer("logits")
    logits.kernel.assign(logits.kernel * 8.0)
    if options["num_classes"] == 1:
        # One logit, through a sigmoid: spread further, and centred where
        # the sigmoid is steepest, so that pairs' scores differ as much.
        logits.kernel.assign(logits.kernel * 8.0)
        activation, logits.activation = logits.activation, keras.activations.linear
        centre = classifier(preprocessor(x=(["mars"], ["red"])), training=False)[0]
        logits.activation = activation
        logits.bias.assign(logits.bias - centre)
    os.makedirs(directory, exist_ok=True)
    classifier.save_to_preset(directory)
    return directory


def keras_hub_predictions(preset, texts, logits=False, seconds=None, one_segment=False):
    """The preset's own outputs for `texts`, and each text's token count.

    What `TextClassifier.predict(texts)` computes: its preprocessor packs the
    texts (start, end and pad tokens, cut to its `sequence_length`), the
    task model maps them to its outputs. `predict()` itself batches through
    an input pipeline that needs `grain` or TensorFlow (neither is installed
    here), so the two steps are called directly.

    Args:
        preset: The classifier's preset.
        texts: The texts, or the first text of each pair.
        logits: Its outputs before its last activation.
        seconds: The second text of each pair, packed after the first as
            `predict((texts, seconds))` packs them.
        one_segment: Whether to put every token in segment 0: what a
            cross-encoder would compute if a pair's segment ids were lost.

    Returns:
        `(outputs, token_counts)`: a `(len(texts), num_classes)` float64
        array and a list of ints.
    """
    classifier = keras_hub.models.TextClassifier.from_preset(preset)
    if logits:
        classifier.get_layer("logits").activation = keras.activations.linear
    inputs = classifier.preprocessor(x=texts if seconds is None else (texts, seconds))
    if one_segment:
        inputs["segment_ids"] = keras.ops.zeros_like(inputs["segment_ids"])
    outputs = keras.ops.convert_to_numpy(classifier(inputs, training=False))
    if "padding_mask" in inputs:
        mask = inputs["padding_mask"]
    else:  # RoFormerV2's: its backbone masks the pad token's id.
        mask = keras.ops.not_equal(inputs["token_ids"], classifier.preprocessor.tokenizer.pad_token_id)
    counts = keras.ops.convert_to_numpy(mask).sum(axis=1)
    return outputs.astype("float64"), [int(count) for count in counts]


def packed_pairs(preset, firsts, seconds):
    """The token ids and segment ids the preset's preprocessor packs each pair to.

    Args:
        preset: The classifier's preset.
        firsts: The first text of each pair.
        seconds: The second.

    Returns:
        `(token_ids, segment_ids)`: a list of lists of ints each, padding
        left out; `segment_ids` is `None` for a preprocessor that gives none.
    """
    preprocessor = keras_hub.models.TextClassifierPreprocessor.from_preset(preset)
    inputs = preprocessor(x=(firsts, seconds))
    counts = keras.ops.convert_to_numpy(inputs["padding_mask"]).sum(axis=1)

    def unpadded(rows):
        rows = keras.ops.convert_to_numpy(rows).tolist()
        return [row[:count] for row, count in zip(rows, counts)]

    segments = inputs.get("segment_ids")
    return unpadded(inputs["token_ids"]), None if segments is None else unpadded(segments)


def save_bert_pair(directory, num_classes=3, sequence_length=SEQUENCE_LENGTH, **shape):
    """`save_hf_pair` of BERT."""
    return save_hf_pair("bert", directory, num_classes, sequence_length, **shape)


def save_hf_pair(family, directory, num_classes=3, sequence_length=SEQUENCE_LENGTH, **shape):
    """The same random classifier as a transformers folder and a preset.

    A random `...ForSequenceClassification` of `family` is saved with
    transformers' own tokenizer of the tiny vocabulary (BERT's lowercasing,
    as its uncased checkpoints; RoBERTa's byte-level BPE): what vLLM native
    serves. keras-hub's converter loads its encoder into the family's
    backbone; its classification head, which the converter leaves out,
    becomes the `TextClassifier`'s own head layers: the preset
    vllm-keras-hub serves.

    Args:
        family: `"bert"` or `"roberta"`.
        directory: Where to save both.
        num_classes: Its outputs.
        sequence_length: What the preset's preprocessor packs texts to.
        **shape: Config values over the tiny ones (a published model's
            sizes, for benchmarks).

    Returns:
        `(transformers_folder, preset_folder)`.
    """
    import numpy as np
    import torch
    import transformers

    hf_folder = os.path.join(directory, "hf")
    tiny = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    tokenizer = encoder_tokenizer(family)
    if family == "roberta":
        # Two rows before the first position (`padding_idx + 1`), as RoBERTa's.
        tiny["max_position_embeddings"] += 2
    config_cls, model_cls, classifier_cls, layers = {
        "bert": (
            transformers.BertConfig,
            transformers.BertForSequenceClassification,
            keras_hub.models.BertTextClassifier,
            {"logits": "classifier"},
        ),
        "roberta": (
            transformers.RobertaConfig,
            transformers.RobertaForSequenceClassification,
            keras_hub.models.RobertaTextClassifier,
            {"pooled_dense": "classifier.dense", "logits": "classifier.out_proj"},
        ),
    }[family]
    # What keras-hub's backbones compute: BERT's gelu is the tanh
    # approximation; RoBERTa's is exact, its norms' epsilon 1e-5 (as its
    # published checkpoints).
    options = dict(hidden_act="gelu_pytorch_tanh")
    if family == "roberta":
        options = dict(
            hidden_act="gelu", layer_norm_eps=1e-5, type_vocab_size=1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2,
        )  # fmt: skip
    config = config_cls(
        **{**tiny, **shape},
        vocab_size=tokenizer.vocabulary_size(),
        num_labels=num_classes,
        **options,
    )
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():  # As `build_tiny_classifier`: outputs spread apart.
        model.get_submodule(layers["logits"]).weight.mul_(8.0)
        if family == "roberta":
            # RoBERTa's one token type adds zeros (its published checkpoints'),
            # which keras-hub's backbone has no weights for.
            model.roberta.embeddings.token_type_embeddings.weight.zero_()
    model.save_pretrained(hf_folder)
    _save_hf_tokenizer(family, tokenizer, hf_folder)

    backbone = keras_hub.models.Backbone.from_preset(hf_folder)
    preprocessor = classifier_cls.preprocessor_cls(
        tokenizer=tokenizer, sequence_length=sequence_length
    )
    classifier = classifier_cls(
        backbone=backbone, preprocessor=preprocessor, num_classes=num_classes
    )
    for name, source in layers.items():
        layer, linear = classifier.get_layer(name), model.get_submodule(source)
        layer.kernel.assign(np.transpose(linear.weight.detach().numpy()))
        layer.bias.assign(linear.bias.detach().numpy())
    preset = os.path.join(directory, "preset")
    classifier.save_to_preset(preset)
    return hf_folder, preset


def _save_hf_tokenizer(family, tokenizer, folder):
    """transformers' tokenizer of the tiny vocabulary of `family`."""
    import json

    import transformers

    if family == "bert":
        tokens = list(tokenizer.get_vocabulary())
        transformers.BertTokenizer(
            vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True
        ).save_pretrained(folder)
        with open(os.path.join(folder, "vocab.txt"), "w") as f:
            f.write("\n".join(tokens) + "\n")
        return
    vocab_file, merges_file = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    with open(vocab_file, "w") as f:
        json.dump(tokenizer.vocabulary, f)
    with open(merges_file, "w") as f:
        f.write("#version: 0.2\n" + "\n".join(tokenizer.merges) + "\n")
    transformers.RobertaTokenizer(vocab_file, merges_file).save_pretrained(folder)

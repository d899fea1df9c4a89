"""Tiny random-weight `TextClassifier` presets, and their own predictions.

Each is a real KerasHub text classifier (backbone, head, preprocessor,
tokenizer) saved with `save_to_preset`, on the tiny encoders of
`embedders.py`: 2 layers, head size 32.
"""

import os

import keras
import keras_hub

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
    # Cross-encoders, scoring text pairs: one logit, BERT's pairs in two
    # segments; a sigmoid of XLM-RoBERTa's, whose pairs are one segment.
    "bert_cross_encoder": ("BertTextClassifier", "bert", dict(num_classes=1)),
    "xlm_roberta_cross_encoder": (
        "XLMRobertaTextClassifier",
        "xlm_roberta",
        dict(num_classes=1, activation="sigmoid"),
    ),
}

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
    backbone = classifier_cls.backbone_cls(
        **embedders._ENCODER, vocabulary_size=tokenizer.vocabulary_size()
    )
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
    counts = keras.ops.convert_to_numpy(inputs["padding_mask"]).sum(axis=1)
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
    """The same random BERT classifier as a transformers folder and a preset.

    A random `BertForSequenceClassification` is saved with transformers'
    own tokenizer of the tiny vocabulary (lowercasing, as BERT's uncased
    checkpoints): what vLLM native serves. keras-hub's converter loads its
    encoder and pooler into a `BertBackbone`; its `classifier` layer, which
    the converter leaves out, becomes the `BertTextClassifier`'s `logits`
    layer: the preset vllm-keras-hub serves.

    Args:
        directory: Where to save both.
        num_classes: Its outputs.
        sequence_length: What the preset's preprocessor packs texts to.
        **shape: `BertConfig` values over the tiny ones (a published
            model's sizes, for benchmarks).

    Returns:
        `(transformers_folder, preset_folder)`.
    """
    import numpy as np
    import torch
    import transformers

    tokens = list(encoder_tokenizer("bert").get_vocabulary())
    hf_folder = os.path.join(directory, "hf")
    tiny = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    config = transformers.BertConfig(
        **{**tiny, **shape},
        vocab_size=len(tokens),
        # KerasHub's BERT layers use the tanh approximation.
        hidden_act="gelu_pytorch_tanh",
        num_labels=num_classes,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    # As `build_tiny_classifier`: outputs spread apart.
    with torch.no_grad():
        model.classifier.weight.mul_(8.0)
    model.save_pretrained(hf_folder)
    transformers.BertTokenizer(
        vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True
    ).save_pretrained(hf_folder)
    with open(os.path.join(hf_folder, "vocab.txt"), "w") as f:
        f.write("\n".join(tokens) + "\n")

    backbone = keras_hub.models.Backbone.from_preset(hf_folder)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer=keras_hub.tokenizers.BertTokenizer(vocabulary=tokens),
        sequence_length=sequence_length,
    )
    classifier = keras_hub.models.BertTextClassifier(
        backbone=backbone, preprocessor=preprocessor, num_classes=num_classes
    )
    logits = classifier.get_layer("logits")
    logits.kernel.assign(np.transpose(model.classifier.weight.detach().numpy()))
    logits.bias.assign(model.classifier.bias.detach().numpy())
    preset = os.path.join(directory, "preset")
    classifier.save_to_preset(preset)
    return hf_folder, preset

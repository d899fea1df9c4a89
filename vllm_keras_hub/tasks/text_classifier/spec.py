"""What a KerasHub `TextClassifier` preset tells vLLM's pooling runner.

A classifier preset names its class in `task.json`, with its number of
classes and the activation of its last layer. vLLM's classify pooler
applies an activation after the model's logits: softmax over two or more
classes, a sigmoid over one, unless the config's `problem_type` says
otherwise (`vllm/model_executor/layers/pooler/activations.py`). So the
served head stops at the logits, and `problem_type` asks vLLM for the
preset's activation: `predict()`'s output is then vLLM's `probs`, and its
logits are what `use_activation=False` returns. A preset with no activation
(`predict()` gives logits) gets vLLM's default, as vLLM's own classifiers
do; its logits are still one request option away.

Texts are served up to the length the preset's preprocessor packs, which
`predict()` cuts longer texts to.

A preset with one output is a cross-encoder: vLLM scores text pairs with it
(`/v1/score`, `/v1/rerank`, `LLM.score`), a sigmoid over its logit. The
KerasHub tokenizer mode packs each pair with the preset's own packer
(`export/keras_hub_tokenizers.py`); BERT's segment ids go to the model as
vLLM's `token_type_ids` (`model.py`).
"""

import dataclasses

# First: keras-hub imports Keras, on torch.
from vllm_keras_hub import keras_on_torch  # noqa: F401
import keras_hub

from vllm_keras_hub import tasks
from vllm_keras_hub.preset import Preset
from vllm_keras_hub.tasks.text_classifier import TASK


class ClassifierError(tasks.PoolingTaskError):
    """A classifier preset that cannot be served, naming the cause."""


@dataclasses.dataclass(frozen=True)
class Head:
    """A classifier class's head after its backbone, as its `__init__` builds it.

    Args:
        backbone: The backbone class it takes.
        layers: `(owner, layer name)` in order, applied to the first token's
            final hidden state; `owner` is `"backbone"` or `"task"`. Dropout
            layers are left out: they pass values through at inference.
        segment_ids: Whether the backbone takes segment ids, which its
            preprocessor sets to 1 on a pair's second text.
    """

    backbone: str
    layers: tuple[tuple[str, str], ...]
    segment_ids: bool = False


# The TextClassifier classes served. BERT pools through its backbone's own
# `pooled_dense` (its `pooled_output`); the others through the task's (tanh,
# or DistilBERT's relu).
HEADS = {
    "BertTextClassifier": Head(
        "BertBackbone", (("backbone", "pooled_dense"), ("task", "logits")), segment_ids=True
    ),
    "XLMRobertaTextClassifier": Head(
        "XLMRobertaBackbone", (("task", "pooled_dense"), ("task", "logits"))
    ),
    "RobertaTextClassifier": Head("RobertaBackbone", (("task", "pooled_dense"), ("task", "logits"))),
    "DistilBertTextClassifier": Head(
        "DistilBertBackbone", (("task", "pooled_dense"), ("task", "logits"))
    ),
    "AlbertTextClassifier": Head(
        "AlbertBackbone", (("backbone", "pooled_dense"), ("task", "logits")), segment_ids=True
    ),
    "RoformerV2TextClassifier": Head(
        "RoformerV2Backbone", (("task", "pooled_dense"), ("task", "logits")), segment_ids=True
    ),
    "ESMProteinClassifier": Head("ESMBackbone", (("task", "pooled_dense"), ("task", "logits"))),
}  # fmt: skip

# The preset's last activation -> vLLM's `problem_type` that applies it.
PROBLEM_TYPES = {
    "linear": None,  # vLLM's default: softmax, or a sigmoid for one class.
    "softmax": "single_label_classification",
    "sigmoid": "multi_label_classification",
}


@dataclasses.dataclass(frozen=True)
class Classifier:
    """How one classifier preset is served.

    Args:
        task: Its `TextClassifier` class name.
        num_classes: Its number of outputs.
        activation: Its last layer's activation: a key of `PROBLEM_TYPES`.
        head: `Head.layers` of its class.
        max_tokens: The longest text its preprocessor packs, or `None`.
        start_token: Whether a start token precedes each text (always, as
            `MultiSegmentPacker` packs it); the end token follows.
        pairs: Whether vLLM scores text pairs with it: one output.
        segment_ids: `Head.segment_ids` of its class: a pair's second text
            comes to the model as vLLM's `token_type_ids`.
    """

    task: str
    num_classes: int
    activation: str
    head: tuple[tuple[str, str], ...]
    max_tokens: int | None = None
    start_token: bool = True
    pairs: bool = False
    segment_ids: bool = False

    def config_fields(self):
        """The `config.json` fields of the classifier's model folder."""
        fields = {
            "architectures": [TASK.architecture],
            TASK.field: dataclasses.asdict(self),
            # transformers names the labels `LABEL_<i>`, as vLLM reports them.
            "num_labels": self.num_classes,
            "is_causal": False,
        }
        if PROBLEM_TYPES[self.activation] is not None:
            fields["problem_type"] = PROBLEM_TYPES[self.activation]
        return fields

    def write_files(self, directory):
        """None: vLLM's classify pooler reads the config alone."""

    def length_limits(self, sentence_config=None):
        """The longest texts served, each with its reason."""
        if self.max_tokens is None:
            return []
        return [
            (
                self.max_tokens,
                f"its preprocessor packs at most {self.max_tokens} tokens, and "
                "`predict()` cuts longer texts",
            )
        ]


def read_classifier(preset, family, backbone_config):
    """The `Classifier` of `preset`, or `None` for a preset that is none.

    Args:
        preset: A `Preset`.
        family: Its `families.Family`.
        backbone_config: Its backbone config.

    Raises:
        ClassifierError: a classifier this project does not serve, naming why.
    """
    preset = Preset.of(preset)
    task_config = preset.task_config
    if task_config is None:
        _refuse_checkpoint_head(preset)
        return None
    name = task_config.get("class_name", "").rpartition(">")[2]
    task_cls = getattr(keras_hub.models, name, None)
    if not (isinstance(task_cls, type) and issubclass(task_cls, keras_hub.models.TextClassifier)):
        return None
    head = HEADS.get(name)
    if head is None or head.backbone != family.backbone:
        raise ClassifierError(
            f"Cannot serve '{preset}': {name} is not a served text classifier; "
            f"served are {sorted(HEADS)}."
        )
    options = task_config.get("config", {})
    num_classes = int(options["num_classes"])
    activation = _activation_name(options.get("activation"))
    if activation not in PROBLEM_TYPES:
        raise ClassifierError(
            f"Cannot serve '{preset}': its last activation is {activation!r}; vLLM's "
            f"classify pooler applies {', '.join(repr(a) for a in PROBLEM_TYPES)} only."
        )
    max_tokens = preset.preprocessor_config.get("sequence_length")
    return Classifier(
        task=name,
        num_classes=num_classes,
        activation=activation,
        head=head.layers,
        max_tokens=int(max_tokens) if max_tokens else None,
        # vLLM scores pairs with a one-output classifier only.
        pairs=num_classes == 1,
        segment_ids=head.segment_ids,
    )


def _activation_name(activation):
    # `keras.activations.serialize`: a name, or for a function a config
    # naming it; `None` is no activation.
    if activation is None:
        return "linear"
    if isinstance(activation, dict):
        activation = activation.get("config", activation.get("class_name"))
    return str(activation)


def _refuse_checkpoint_head(preset):
    """Refuses a Hugging Face classifier checkpoint: no converter loads its head."""
    if preset.converter is None:
        return
    architectures = (preset.config or {}).get("architectures") or []
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        raise ClassifierError(
            f"Cannot serve '{preset}': keras-hub's converter loads the backbone of "
            f"{architectures[0]}, not its classification head. Serve the "
            "`TextClassifier` saved with `save_to_preset`."
        )

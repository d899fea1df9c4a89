"""What a KerasHub `TextEmbedder` preset tells vLLM's pooling runner.

A preset saved from a `TextEmbedder` names its class in `task.json`; an
EmbeddingGemma backbone (`Gemma3Backbone(is_embedding_model=True)`) carries
its pooling head inside. Either is served as a vLLM pooling model
(`models/pooling.py`). The model folder says how it pools in the
sentence-transformers files vLLM reads for its own embedders (`modules.json`,
`1_Pooling/config.json`), so plain `vllm serve` of the folder picks the
pooling runner and the preset's pooling, and vLLM knows, as for its own
models, that mean pooling and bidirectional attention take no chunked
prefill or prefix cache.
"""

import dataclasses
import json
import os

from vllm_keras_hub import families
from vllm_keras_hub import tasks
from vllm_keras_hub.tasks.text_embedder import TASK

# The TextEmbedder classes served, by the backbone each takes.
SERVED = {family.embedder: family.backbone for family in families.FAMILIES if family.embedder}
# Encoders: every token attends to the whole text.
ENCODERS = tuple(
    family.embedder for family in families.FAMILIES if family.embedder and family.embedder_only
)
# KerasHub `pooling_mode` -> vLLM's sequence pooling type.
POOLING = {"mean": "MEAN", "last": "LAST", "cls": "CLS"}

# The Matryoshka dimensions of each form's published model, from its model
# card: EmbeddingGemma is trained for 768, 512, 256 and 128; Qwen3-Embedding
# for any output dimension up to its size.
EMBEDDING_GEMMA_MATRYOSHKA = (512, 256, 128)


class EmbedderError(tasks.PoolingTaskError):
    """An embedder preset that cannot be served, naming the cause."""


@dataclasses.dataclass(frozen=True)
class Embedder:
    """How one embedder preset pools, as its `TextEmbedder` computes.

    Args:
        task: The `TextEmbedder` class name, or the backbone's for an
            EmbeddingGemma backbone saved without one.
        pooling: vLLM's sequence pooling type: `"MEAN"`, `"LAST"` or `"CLS"`.
        normalize: Whether embeddings are L2-normalized.
        projection: Whether the backbone's own projection head follows the
            pooling (EmbeddingGemma's two Dense layers).
        size: The embedding's width.
        bidirectional: Whether its attention is bidirectional.
        max_tokens: The longest text served exactly, or `None` for the
            backbone's own limit (`bidirectional_window_limit`).
        start_token: Whether its preprocessor packs a start token before
            each text (all but `Qwen3TextEmbedderPreprocessor`, which packs
            only the end token).
    """

    task: str
    pooling: str
    normalize: bool
    projection: bool
    size: int
    bidirectional: bool
    max_tokens: int | None = None
    start_token: bool = True

    def config_fields(self):
        """The `config.json` fields of the embedder's model folder."""
        fields = {
            "architectures": [TASK.architecture],
            TASK.field: dataclasses.asdict(self),
            "embedding_size": self.size,
            "is_causal": not self.bidirectional,
        }
        if self.projection:
            dimensions = {self.size}
            dimensions.update(d for d in EMBEDDING_GEMMA_MATRYOSHKA if d < self.size)
            fields["matryoshka_dimensions"] = sorted(dimensions, reverse=True)
        elif self.task == "Qwen3TextEmbedder":
            fields["is_matryoshka"] = True
        return fields

    def length_limits(self, sentence_config=None):
        """The longest texts served, each with its reason (`length_limits`)."""
        return length_limits(self, sentence_config)

    def write_files(self, directory):
        """Writes the sentence-transformers pooling files vLLM reads.

        No `Dense` module is listed: vLLM would build its own copy of it;
        the preset's own projection runs instead (`models/pooling.py`).
        """
        modules = [{"idx": 0, "name": "1", "path": "1_Pooling", "type": _POOLING}]
        if self.normalize:
            modules.append({"idx": 1, "name": "2", "path": "2_Normalize", "type": _NORMALIZE})
        os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
        with open(os.path.join(directory, "modules.json"), "w") as f:
            json.dump(modules, f, indent=2)
        mode = {"MEAN": "mean", "LAST": "lasttoken", "CLS": "cls"}[self.pooling]
        with open(os.path.join(directory, "1_Pooling", "config.json"), "w") as f:
            json.dump({"pooling_mode": mode}, f, indent=2)


_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


def read_embedder(preset, family, backbone_config):
    """The `Embedder` of `preset`, or `None` for a preset that is no embedder.

    Args:
        preset: A preset reference.
        family: Its `families.Family`.
        backbone_config: Its backbone config.

    Raises:
        EmbedderError: an embedder this project does not serve, naming why.
    """
    backbone_cls_name = family.backbone
    task = _task_config(preset, backbone_cls_name)
    name = (task or {}).get("class_name", "").rpartition(">")[2]
    in_backbone = bool(backbone_config.get("is_embedding_model"))
    if not name.endswith("TextEmbedder") and not in_backbone:
        return None
    if name and SERVED.get(name) != backbone_cls_name:
        raise EmbedderError(
            f"Cannot serve '{preset}': {name} on {backbone_cls_name} is not a "
            f"served text embedder; served are {sorted(SERVED)}."
        )
    options = (task or {}).get("config", {})
    bidirectional = name in ENCODERS or bool(
        backbone_config.get("use_bidirectional_attention")
    )
    max_tokens = bidirectional_window_limit(backbone_config) if bidirectional else None
    if in_backbone:
        # `Gemma3TextEmbedder` returns the backbone's `pooled_output` as is,
        # whatever its own pooling options.
        return Embedder(
            task=name or backbone_cls_name,
            pooling="MEAN",
            normalize=True,
            projection=True,
            size=int(backbone_config["embedding_dim"]),
            bidirectional=bidirectional,
            max_tokens=max_tokens,
        )
    pooling = options.get("pooling_mode", "mean" if name in ENCODERS else "last")
    if pooling not in POOLING:
        raise EmbedderError(
            f"Cannot serve '{preset}': pooling_mode={pooling!r} has no vLLM "
            f"pooling; {', '.join(repr(mode) for mode in POOLING)} do."
        )
    return Embedder(
        task=name,
        start_token=name != "Qwen3TextEmbedder",
        pooling=POOLING[pooling],
        normalize=bool(options.get("normalize", True)),
        projection=False,
        size=int(backbone_config["hidden_dim"]),
        bidirectional=bidirectional,
        max_tokens=max_tokens,
    )


def length_limits(embedder, sentence_config=None):
    """The longest texts `embedder` is served for, each with its reason.

    Args:
        embedder: An `Embedder`.
        sentence_config: A checkpoint's sentence-transformers config
            (`checkpoint_tokenizer.sentence_transformers_config`), or `None`.

    Returns:
        A list of `(tokens, reason)`.
    """
    limits = []
    if embedder.max_tokens is not None:
        limits.append(
            (
                embedder.max_tokens,
                "its bidirectional sliding-window attention is served exactly for "
                f"texts of at most {embedder.max_tokens} tokens (see export/embedder.py)",
            )
        )
    if sentence_config is not None:
        length = int(sentence_config["max_seq_length"])
        # vLLM serves the checkpoint itself no longer (`_get_and_verify_max_len`).
        limits.append(
            (
                length,
                f"its sentence-transformers config sets max_seq_length={length}, "
                "the longest text it embeds",
            )
        )
    return limits


def bidirectional_window_limit(backbone_config):
    """The longest text a bidirectional Gemma3 attends to exactly on vLLM.

    Its sliding layers attend over an asymmetric band, `sliding_window // 2`
    tokens after each token and one fewer before
    (`Gemma3Attention._compute_bidirectional_sliding_mask`). vLLM's
    encoder-only attention kernel takes one window for both sides, and on
    this CPU it gave other embeddings than KerasHub's band (a 0.14 max
    difference, tiny preset, window 8). Texts no longer than the band's
    shorter side plus one see their whole text in every layer, so the
    window never applies and vLLM's kernel runs without one: for
    EmbeddingGemma (window 512) that is 256 tokens, the sequence length its
    own preprocessor packs to. `None` where no layer has a window.
    """
    if not backbone_config.get("use_sliding_window_attention"):
        return None
    window = int(backbone_config["sliding_window_size"])
    return window - window // 2



def _task_config(preset, backbone_cls_name):
    """The preset's `task.json`, or what stands for it in a checkpoint.

    A Hugging Face checkpoint (`hf://...`, or its local folder) has no
    `task.json`; a sentence-transformers one has `modules.json`, from which
    keras-hub's converter reads the pooling and normalization its
    `TextEmbedder.from_preset` builds (`load_task_config`).
    """
    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    if preset.task_config is not None:
        return preset.task_config
    converter = preset.converter
    names = [name for name, backbone in SERVED.items() if backbone == backbone_cls_name]
    if converter is None or not names or not preset.has("modules.json"):
        return None
    config = {}
    if hasattr(converter, "load_task_config"):
        config = converter.load_task_config(preset.reference, preset.config)
    return {"class_name": names[0], "config": config}

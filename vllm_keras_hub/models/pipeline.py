"""Pipeline parallelism: each stage holds and runs only its own layers.

vLLM cuts a model's transformer layers into contiguous stages, one per
pipeline rank (`get_pp_indices`, or `VLLM_PP_LAYER_PARTITION`), and sends
each stage's hidden states to the next as `IntermediateTensors`. A KerasHub
backbone's forward is a Keras functional graph: the embedding, the
transformer layers in order, the final norm. A stage runs the part of that
graph between its boundaries, as a Keras model cut from the backbone's own
graph (Keras builds a model between any of a graph's tensors), so the
layers, their arguments and their order stay KerasHub's:
- the first stage starts at the backbone's inputs, a later one at the
  hidden states the previous transformer layer returns, with the
  backbone's other inputs (the padding mask) alongside;
- the last stage ends at the backbone's output, the others at their last
  transformer layer's output.

The embedding belongs to the first stage, the final norm and the output
head to the last (a tied head also keeps the embedding there, as vLLM's
own models do); every other variable belongs to the stage of the
transformer layer that owns it. `Stage.unused_variables` lists what the
stage never uses, which the loader never reads (`preset_weights.py`).

Gemma4's text path is a loop over its layers (`text_forward.py`):
- its per-layer inputs are made on the first stage, from the token ids and
  the input embeddings, and travel beside the hidden states to the stages
  after it, as vLLM's own Gemma4 sends them;
- a KV-sharing layer attends over the KV cache of an earlier layer, which
  must be on its rank. The stage boundaries vLLM would pick are moved down
  so that each KV-sharing layer is in the stage of the layer it reads (its
  K/V cannot travel: it is that layer's whole paged cache). A partition
  given in `VLLM_PP_LAYER_PARTITION` that separates them is refused.
"""

import dataclasses

import torch

from vllm_keras_hub import families
from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.models import prompt_embeds
from vllm_keras_hub.models.text_forward import text_forward
from vllm_keras_hub.parallel_settings import PIPELINE_REFUSALS
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError


@dataclasses.dataclass
class Stage:
    """The transformer layers one pipeline stage runs, and how.

    Args:
        backbone: The KerasHub backbone (its weights may not be loaded).
        start: The stage's first transformer layer.
        end: One past its last.
        rank: The stage's pipeline rank.
        size: Stages in all.
        model: The Keras model cut from the backbone's graph, or `None`
            where the whole backbone runs (one stage) or the text path is
            a loop over the layers (Gemma3 and Qwen3.5 vision presets,
            Gemma4).
        hidden_size: The width of what enters a stage after the first: the
            hidden states, and Gemma4's per-layer inputs beside them.
        embedding: With prompt embeddings (`prompt_embeds.py`): the Keras
            model of the graph from the token ids to the first transformer
            layer's input; `model` then starts there.
    """

    backbone: object
    start: int
    end: int
    rank: int
    size: int
    model: object = None
    hidden_size: int = 0
    embedding: object = None

    @property
    def first(self):
        return self.rank == 0

    @property
    def last(self):
        return self.rank == self.size - 1

    @property
    def layers(self):
        """This stage's transformer layers."""
        return transformer_layers(self.backbone)[self.start : self.end]

    def forward(self, token_ids, padding_mask, positions, hidden=None):
        """This stage's part of the backbone's forward pass.

        Args:
            token_ids: `(batch, length)` token ids.
            padding_mask: `(batch, length)` ones where a token is real.
            positions: `(batch, length)` position of each token.
            hidden: `(batch, length, hidden_size)` hidden states from the
                previous stage; on the first, the input embeddings of a
                preset served with images, else `None`.

        Returns:
            `(batch, length, hidden_size)`: the backbone's final hidden
            states on the last stage, the input of the next stage on others.
        """
        if self.embedding is not None:
            if hidden is None:  # Token ids alone (the start-up probe).
                hidden = self.embedding(token_ids)
            return self.model([hidden, padding_mask])
        if self.size == 1:
            return text_forward(
                self.backbone, token_ids, padding_mask, positions, hidden=hidden
            )
        if self.model is None:
            return text_forward(
                self.backbone, token_ids, padding_mask, positions,
                layers=(self.start, self.end), hidden=hidden,
            )  # fmt: skip
        if self.first:
            return self.model({"token_ids": token_ids, "padding_mask": padding_mask})
        return self.model([hidden, padding_mask])

    def embed(self, input_ids):
        """`(num_tokens, hidden_size)` first-layer inputs of packed `input_ids`."""
        return self.embedding(input_ids.reshape(-1, 1))[:, 0, :]

    def packed_forward(self, input_ids, positions, hidden=None):
        """`forward` on vLLM's packed tokens of all requests.

        vLLM packs the tokens of all requests into one ragged sequence. Fed
        as a batch of one-token rows, decoder masks degenerate and only
        vLLM's attention mixes tokens.

        Args:
            input_ids: `(num_tokens,)` token ids; `None` with embeddings.
            positions: `(num_tokens,)` absolute position of each token.
            hidden: `(num_tokens, hidden_size)` from the previous stage, or
                on the first the input embeddings (images), or `None`.

        Returns:
            `(num_tokens, hidden_size)` hidden states.
        """
        if input_ids is None:  # Only the embeddings' rows count.
            input_ids = torch.zeros(
                positions.shape[-1], dtype=torch.int32, device=positions.device
            )
        token_ids = input_ids.reshape(-1, 1)
        if hidden is not None:
            hidden = hidden.reshape(-1, 1, hidden.shape[-1])
        out = self.forward(
            token_ids, torch.ones_like(token_ids), positions.reshape(-1, 1), hidden
        )
        return out[:, 0, :]

    def unused_variables(self):
        """The backbone's variables this stage never reads.

        One stage uses them all. Otherwise the variables of the layers it
        runs; of the token embedding, on the first stage its input table,
        on the last its output projection (the same table, if tied).
        """
        if self.size == 1:
            return []
        embedding = token_embedding(self.backbone)
        used = {
            id(variable)
            for layer in self._used_layers()
            if layer is not embedding
            for variable in layer.variables
        }
        if self.first or self.last:
            used.update(id(variable) for variable in embedding.variables)
            if not getattr(embedding, "tie_weights", True):
                # The variables, not the `embeddings` property's value.
                if not self.first:
                    used.discard(id(embedding._embeddings))
                if not self.last:
                    used.discard(id(embedding.reverse_embeddings))
        return [v for v in self.backbone.variables if id(v) not in used]

    def _used_layers(self):
        if self.model is not None:
            return list(self.model._flatten_layers(include_self=False))
        layers = list(self.layers)
        if self.first:
            # What a loop path runs before its first layer: the embeddings,
            # Gemma4's per-layer inputs, and the media encoders.
            decoder = {id(layer) for layer in transformer_layers(self.backbone)}
            decoder.add(id(self.backbone.layer_norm))
            layers += [
                layer
                for layer in self.backbone._flatten_layers(
                    include_self=False, recursive=False
                )
                if id(layer) not in decoder
            ]
        if self.last:
            layers.append(self.backbone.layer_norm)
        return layers


def _cut(backbone, start, end, last, from_embeddings=False):
    """The Keras model of the backbone's graph for layers `[start, end)`,
    from its inputs, or from the first layer's (`from_embeddings`)."""
    import keras

    layers = transformer_layers(backbone)
    if from_embeddings:
        inputs = [prompt_embeds.first_layer_input(backbone), backbone.input["padding_mask"]]
    elif start == 0:
        inputs = backbone.input
    else:
        hidden = layers[start - 1].output
        if not isinstance(hidden, keras.KerasTensor):
            raise UnsupportedParallelismError(
                f"{type(backbone).__name__} cannot be cut into pipeline "
                f"stages: its layer {layers[start - 1].name} returns "
                f"{type(hidden).__name__}, not one hidden state."
            )
        others = [name for name in backbone.input if name != "token_ids"]
        if others != ["padding_mask"]:
            raise UnsupportedParallelismError(
                f"{type(backbone).__name__} cannot be cut into pipeline stages: "
                f"its layers take inputs {others}, where a stage passes the "
                "padding mask only."
            )
        inputs = [hidden, backbone.input["padding_mask"]]
    outputs = backbone.output if last else layers[end - 1].output
    try:
        # Stateless: tracking the layers' variables would read them, and
        # the weights may not be loaded yet.
        with keras.StatelessScope(initialize_variables=False):
            return keras.Model(inputs, outputs, name=f"stage_{start}_{end}")
    except ValueError as error:
        raise UnsupportedParallelismError(
            f"{type(backbone).__name__} cannot be cut into pipeline stages "
            f"between its layers {start - 1} and {start}: the layers after "
            f"the cut need more than its hidden states and inputs ({error})."
        ) from error


def stage(backbone, rank=0, size=1, prompt_embeddings=False):
    """The pipeline stage `rank` of `size` of `backbone`.

    Args:
        backbone: A KerasHub backbone, its weights loaded or not.
        rank: The pipeline rank.
        size: The pipeline-parallel size.
        prompt_embeddings: Whether the stage, the only one, takes input
            embeddings for every token (`prompt_embeds.py`).

    Raises:
        UnsupportedParallelismError: a backbone that cannot be cut.
        settings.PromptEmbedsError: one that cannot take embeddings.
    """
    from vllm.distributed.utils import get_pp_indices

    layers = transformer_layers(backbone)
    if prompt_embeddings:  # On one stage (`settings.check_prompt_embeds`).
        prompt_embeds.check(backbone, _loop_path(backbone))
        return prompt_embeds.stage(Stage(backbone, 0, len(layers), 0, 1), _cut)
    if size == 1:
        return Stage(backbone, 0, len(layers), 0, 1)
    reason = PIPELINE_REFUSALS.get(type(backbone).__name__)
    if reason is not None:
        raise UnsupportedParallelismError(
            f"{type(backbone).__name__} cannot be served with pipeline "
            f"parallelism: {reason}."
        )
    starts = [get_pp_indices(len(layers), index, size)[0] for index in range(size)]
    starts = _keep_kv_sharing_together(layers, starts)
    _check_attention_in_every_stage(layers, starts)
    start, end = (starts + [len(layers)])[rank : rank + 2]
    if start == end:
        raise UnsupportedParallelismError(
            f"Pipeline stage {rank} of {size} would hold none of the "
            f"{len(layers)} transformer layers; give each stage at least one "
            "(VLLM_PP_LAYER_PARTITION)."
        )
    if _loop_path(backbone):
        width = int(backbone.hidden_dim) + _per_layer_width(backbone)
        return Stage(backbone, start, end, rank, size, None, width)
    model = _cut(backbone, start, end, rank == size - 1)
    return Stage(
        backbone, start, end, rank, size, model, int(model.outputs[0].shape[-1])
    )


def _loop_path(backbone):
    # `text_forward`'s own loop over the layers (no functional graph).
    family = families.family_for_backbone(type(backbone).__name__)
    return family.text_loop is not None and family.text_loop(backbone)


def _per_layer_width(backbone):
    # Per-layer inputs of all layers (Gemma4's), which cross with the
    # hidden states (the family's `text_forward`).
    per_layer = getattr(backbone, "hidden_size_per_layer_input", 0) or 0
    return per_layer * len(transformer_layers(backbone))


def _keep_kv_sharing_together(layers, starts):
    """Stage starts with each KV-sharing layer in its source layer's stage.

    Args:
        layers: The backbone's transformer layers.
        starts: The first layer of each stage, as vLLM cuts them.

    Raises:
        UnsupportedParallelismError: where `VLLM_PP_LAYER_PARTITION` asks
            for a cut between a KV-sharing layer and its source.
    """
    import os

    pairs = [
        (layer.kv_shared_layer_index, index)
        for index, layer in enumerate(layers)
        if getattr(layer, "is_kv_shared_layer", False)
    ]
    moved = []
    for start in starts:
        split = [source for source, sharer in pairs if source < start <= sharer]
        if split and os.environ.get("VLLM_PP_LAYER_PARTITION"):
            source, sharer = next(
                (source, sharer) for source, sharer in pairs if source < start <= sharer
            )
            raise UnsupportedParallelismError(
                f"VLLM_PP_LAYER_PARTITION={os.environ['VLLM_PP_LAYER_PARTITION']} "
                f"starts a pipeline stage at layer {start}, between layer "
                f"{sharer}, which attends over layer {source}'s KV cache, and "
                f"layer {source}: a KV-sharing layer must be in its source "
                f"layer's stage. Start that stage at layer {min(split)} or "
                "before."
            )
        moved.append(min(split) if split else start)
    if moved != starts and any(a >= b for a, b in zip(moved, moved[1:])):
        first_source = min(source for source, _ in pairs)
        raise UnsupportedParallelismError(
            f"{len(starts)} pipeline stages cannot each hold a layer: the "
            f"KV-sharing layers and the layers whose KV caches they read "
            f"(layers {first_source} to {len(layers) - 1}) must be in one "
            f"stage, which leaves {first_source} layers for the others."
        )
    return moved


def _check_attention_in_every_stage(layers, starts):
    """Raises where a hybrid model's stage would hold no attention layer.

    vLLM 0.32's engine asks every worker which KV cache layouts its layers'
    backends take and asserts that all agree (`resolve_kv_cache_layout`):
    a stage of Gated DeltaNet layers alone takes any, so it never does.
    """
    kinds = [getattr(layer, "layer_type", None) for layer in layers]
    if "linear_attention" not in kinds:
        return
    bounds = starts + [len(layers)]
    for rank, (start, end) in enumerate(zip(bounds, bounds[1:])):
        if "full_attention" not in kinds[start:end]:
            attending = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
            raise UnsupportedParallelismError(
                f"Pipeline stage {rank} would hold layers {start} to {end - 1}, "
                "Gated DeltaNet layers only: vLLM 0.32 needs every stage to "
                "hold an attention layer (its workers must agree on one KV "
                "cache layout). Give each stage one of the attention layers "
                f"{attending} (VLLM_PP_LAYER_PARTITION), or fewer stages."
            )


def check_stages(preset, pipeline_parallel_size):
    """Raises where `preset` cannot be cut into this many stages.

    The cut depends on the layers (Gemma4's KV-sharing layers stay with
    their sources, each hybrid stage needs an attention layer), read here
    off the backbone with no weight allocated, so `serve` and `KerasHubLLM`
    stop before the engine starts.

    Args:
        preset: The preset's path or handle.
        pipeline_parallel_size: vLLM's `pipeline_parallel_size`.
    """
    if not pipeline_parallel_size or pipeline_parallel_size < 2:
        return
    from vllm_keras_hub.loading.preset_weights import unloaded_backbone

    backbone = unloaded_backbone(preset, "float32")
    for rank in range(pipeline_parallel_size):
        stage(backbone, rank, pipeline_parallel_size)

"""The vLLM pooling model class of KerasHub text embedders.

A `TextEmbedder` preset (`export/embedder.py`) runs its own backbone as
`KerasHubForCausalLM` does (`base.py`), its attention on vLLM's kernels: causal, or
through vLLM's encoder-only attention where the backbone attends
bidirectionally (EmbeddingGemma). vLLM's pooling runner then pools the final
hidden states with the preset's pooling (mean or last token, both over the
tokens its preprocessor packs: the export's tokenizer adds the same start
and end tokens), then the preset's own projection head where it has one
(EmbeddingGemma's two Dense layers), then L2 normalization where the
preset normalizes. vLLM slices Matryoshka `dimensions` before normalizing,
as sentence-transformers truncates.
"""

import dataclasses

from torch import nn
from vllm.model_executor.layers.pooler.activations import PoolerNormalize
from vllm.model_executor.layers.pooler.seqwise.heads import EmbeddingPoolerHead
from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
from vllm.model_executor.layers.pooler.seqwise.poolers import SequencePooler
from vllm.model_executor.layers.pooler.special import DispatchPooler

from vllm.model_executor.models.interfaces import SupportsPP

from vllm_keras_hub.models.base import KerasHubBase
from vllm_keras_hub.models.base import compiled

# EmbeddingGemma's projection head in `Gemma3Backbone`, in order.
PROJECTION_LAYERS = ("pooling_dense_1", "embedding_projection")


class Projection(nn.Module):
    """The backbone's own projection head, on pooled embeddings.

    Args:
        layers: The KerasHub layers to apply, in order.
    """

    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def forward(self, pooled):
        for layer in self.layers:
            pooled = layer(pooled)
        return pooled


class EmbeddingMixin:
    """vLLM's pooler over the last hidden states, as the preset's embedder
    pools them (its settings checked by the base, `settings.verify`: no
    adapters, drafts or stages)."""

    is_pooling_model = True

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.embedder = vllm_config.model_config.hf_config.keras_hub_embedder
        self.encoder_only = self.embedder["bidirectional"]
        limit = self.embedder["max_tokens"]
        max_model_len = vllm_config.model_config.max_model_len
        if limit is not None and max_model_len > limit:
            raise ValueError(
                f"{self._name}: its bidirectional sliding-window attention is "
                f"served exactly for texts of at most {limit} tokens; "
                f"max_model_len={max_model_len} is longer."
            )
        self.pooler = None

    def load_preset(self, lora_weights=None):
        """Loads the backbone (`KerasHubBase`), then builds the pooler."""
        super().load_preset(lora_weights)
        self.pooler = self._pooler()

    def _probe(self, stage, state_layers, moe_blocks):
        routes = super()._probe(stage, state_layers, moe_blocks)
        if self.embedder["max_tokens"] is not None:
            # No text is longer than the window's shorter side (`__init__`).
            routes.specs[:] = [
                dataclasses.replace(spec, sliding_window=None) for spec in routes.specs
            ]
        return routes

    def _pooler(self):
        model_config = self.vllm_config.model_config
        pooling_type = model_config.pooler_config.seq_pooling_type
        if pooling_type != self.embedder["pooling"]:
            # vLLM decides chunked prefill and prefix caching by this type.
            raise ValueError(
                f"{self._name} pools with {self.embedder['pooling']} as its "
                f"{self.embedder['task']} does; the engine was set to pool with "
                f"{pooling_type} (--pooler-config)."
            )
        projection = None
        if self.embedder["projection"]:
            layers = [self.backbone.get_layer(name) for name in PROJECTION_LAYERS]
            projection = Projection(layers)
        head = EmbeddingPoolerHead(
            projector=projection,
            head_dtype=model_config.head_dtype,
            activation=PoolerNormalize() if self.embedder["normalize"] else None,
        )
        pooling = get_seq_pooling_method(self.embedder["pooling"])
        return DispatchPooler({"embed": SequencePooler(pooling=pooling, head=head)})

    def compute_logits(self, hidden_states):
        raise NotImplementedError("A text embedder pools; it has no logits.")


# `SupportsPP` leaves the refusal of pipeline parallelism to
# `settings.check_pooling_settings`, which names the reason.
@compiled
class KerasHubForEmbedding(EmbeddingMixin, KerasHubBase, SupportsPP):
    """A KerasHub `TextEmbedder` preset served by vLLM's pooling runner.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config`
            carries the preset's `keras_hub_embedder` fields.
        prefix: Module prefix vLLM gives the model.
    """

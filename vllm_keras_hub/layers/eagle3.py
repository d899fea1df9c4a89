"""What an EAGLE-3 drafter reads of a KerasHub target: hidden states, embedding.

vLLM's EAGLE-3 heads draft from the target's auxiliary hidden states, the
residual stream at a few layers (`SupportsEagle3`), and share the target's
token embedding (`SpecDecodeBaseProposer._maybe_share_embeddings` reads
`target.model.embed_tokens`). vLLM's own models keep both on `self.model`,
an `EagleModelMixin`; `EagleTarget` is that object for a KerasHub backbone.

Aux layer `k` is vLLM's: the residual stream entering transformer layer
`k`, and for `k` = the number of layers the last layer's output, before the
final norm (`EagleModelMixin._maybe_add_hidden_state`). A tapped KerasHub
transformer layer hands its hidden-state input (or output) to the step
context as it runs, so the taps follow the backbone's own graph.
"""

import torch
from torch import nn
from torch.nn import functional
from vllm.model_executor.models.interfaces import EagleModelMixin

from vllm_keras_hub.compile.direct_calls import direct_call
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.layers.parallel import vocab_parallel
from vllm_keras_hub.models.probe import RouteError

_TAPPED_CLASSES = {}


class SharedEmbedding(nn.Module):
    """The backbone's token embedding table, as a drafter's `embed_tokens`.

    A plain lookup, unscaled, as vLLM's `VocabParallelEmbedding` is (Gemma's
    scale is the model's, not the embedding's, in vLLM and KerasHub alike).
    `weight` is the Keras variable's own tensor: nothing is copied.

    Args:
        backbone: The loaded KerasHub backbone.
    """

    def __init__(self, backbone):
        super().__init__()
        embedding = token_embedding(backbone)
        # Under tensor parallelism, the rank's rows (`vocab_parallel.py`).
        table = vocab_parallel.vocab_parallel_table(embedding)
        self.__dict__["_embedding"] = embedding if table is not None else None
        # Not registered: the table stays the backbone's (or vLLM's).
        self.__dict__["weight"] = (
            table.weight if table is not None else embedding.embeddings.value
        )

    def forward(self, input_ids):
        if self._embedding is not None:
            return vocab_parallel.lookup(self._embedding, input_ids)
        return functional.embedding(input_ids, self.weight)


class EagleTarget(EagleModelMixin):
    """The target's `model`, as vLLM's EAGLE proposers read it.

    Args:
        backbone: The loaded KerasHub backbone.
    """

    def __init__(self, backbone):
        self.backbone = backbone
        self.layers = transformer_layers(backbone)
        self.start_layer = 0
        self._embed_tokens = None

    @property
    def embed_tokens(self):
        """The token embedding a drafter shares, made when one asks."""
        if self._embed_tokens is None:
            self._embed_tokens = SharedEmbedding(self.backbone)
        return self._embed_tokens

    def _set_aux_hidden_state_layers(self, layers):
        super()._set_aux_hidden_state_layers(layers)
        tap(self.layers, self.aux_hidden_state_layers, int(self.backbone.hidden_dim))


def default_aux_layers(num_layers):
    """vLLM's default EAGLE-3 aux layers, `(2, L // 2, L - 3)`, kept in range."""
    layers = (2, num_layers // 2, num_layers - 3)
    return tuple(sorted({min(max(k, 0), num_layers) for k in layers}))


def _hidden(value, hidden_size, name):
    value = value[0] if isinstance(value, (tuple, list)) else value
    if not isinstance(value, torch.Tensor) or value.shape[-1] != hidden_size:
        shape = getattr(value, "shape", type(value).__name__)
        raise RouteError(
            f"{name} does not take and return one residual stream of width "
            f"{hidden_size} (got {shape}), so its hidden states cannot feed an "
            "EAGLE-3 drafter."
        )
    return value.reshape(-1, hidden_size)


def tapped_call(self, *args, **kwargs):
    aux = step.current().aux_hidden
    if aux is not None and self._aux_before:
        hidden = args[0] if args else next(iter(kwargs.values()))
        aux.append(_hidden(hidden, self._aux_width, self.name))
    output = direct_call(self, *args, **kwargs)
    if aux is not None and self._aux_after:
        aux.append(_hidden(output, self._aux_width, self.name))
    return output


def _tapped_class(cls):
    if cls not in _TAPPED_CLASSES:
        _TAPPED_CLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {"__call__": tapped_call, "__module__": cls.__module__},
        )
    return _TAPPED_CLASSES[cls]


def tap(layers, indices, hidden_size):
    """Makes `layers` hand the step their aux hidden states `indices`.

    Args:
        layers: The backbone's transformer layers, with direct calls.
        indices: vLLM's aux layer indices, each in `[0, len(layers)]`.
        hidden_size: The residual stream's width.

    Raises:
        ValueError: an index out of range.
    """
    bad = [k for k in indices if not 0 <= k <= len(layers)]
    if bad:
        raise ValueError(
            f"EAGLE-3 aux hidden state layers {bad} are outside the target's "
            f"0..{len(layers)} (layer k: the input of transformer layer k; "
            f"{len(layers)}: the last layer's output)."
        )
    for index, layer in enumerate(layers):
        layer._aux_before = index in indices
        layer._aux_after = index == len(layers) - 1 and len(layers) in indices
        layer._aux_width = hidden_size
        tapped = layer._aux_before or layer._aux_after
        if tapped and type(layer).__call__ is not tapped_call:
            layer.__class__ = _tapped_class(type(layer))

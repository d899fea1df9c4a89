"""Prompt embeddings (`--enable-prompt-embeds`) for presets served on token ids.

With prompt embeddings on, vLLM gives the first pipeline stage input
embeddings for every token and no token ids: a prompt's own
`prompt_embeds` where it sent them, and for token ids what the model's
`embed_input_ids` returns. Both are what enters the first transformer
layer, as vLLM's own models take them (vLLM's Gemma scales its token
embeddings there, as KerasHub's Gemma backbones do before their first
layer).

Both halves are the backbone's own functional graph, cut at its first
transformer layer's input as `pipeline.py` cuts stages: the token
embedding (with the ops the backbone applies to it, such as Gemma's
scale), and the rest. Refused at start-up, each with the reason:
- a backbone with a weighted layer between its token embedding and its
  first transformer layer (GPT-2's and OPT's learned positions, BLOOM's
  embedding norm): vLLM's own models of those families take prompt
  embeddings before it, and that layer needs the step's positions;
- one whose layers need more than the hidden states and the padding mask,
  or whose text path is a loop over its layers (Gemma3n's and Gemma4's
  per-layer inputs come from the token ids).
The settings it is not proven with (images, tensor and pipeline
parallelism, LoRA adapters, drafts, pooling tasks) are refused before the
engine starts (`settings.py`).
"""

import dataclasses

import keras

from vllm_keras_hub.layers.attention import attention
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError
from vllm_keras_hub.settings import PromptEmbedsError


def first_layer_input(backbone):
    """The hidden states the backbone's graph feeds its first transformer layer."""
    layer = transformer_layers(backbone)[0]
    nodes = layer._inbound_nodes
    hidden = None
    if len(nodes) == 1:
        # Positional, or as Falcon's backbone passes it, `inputs=`.
        arguments = nodes[0].arguments
        hidden = arguments.args[0] if arguments.args else arguments.kwargs.get("inputs")
    if not isinstance(hidden, keras.KerasTensor):
        raise PromptEmbedsError(
            f"{type(backbone).__name__} cannot take prompt embeddings: its first "
            f"transformer layer {layer.name} is not called once on one hidden state."
        )
    # Keras 3.15 bug: `ops.multiply`'s symbolic output counts an operand
    # that is not a tensor as sparse (`Multiply.compute_output_spec`), so
    # Gemma's scaled embeddings are marked sparse, and a model cut there
    # gets a sparse input, which the torch backend refuses. They are dense.
    # This can go when a scalar operand no longer makes the output sparse.
    if hidden.sparse:
        hidden._sparse = False
    return hidden


def check(backbone, loop_path):
    """Raises for a backbone whose text path is not one functional graph.

    Args:
        backbone: The KerasHub backbone.
        loop_path: Whether its text path is a loop over its layers.
    """
    if loop_path:
        raise PromptEmbedsError(
            f"{type(backbone).__name__} cannot take prompt embeddings: this "
            "preset's text path is a loop over its layers, whose inputs beside "
            "the hidden states are made from the token ids."
        )


def stage(found, cut):
    """`found`, the backbone's one stage, taking input embeddings.

    Args:
        found: The stage as it takes token ids.
        cut: `pipeline._cut`.
    """
    backbone = found.backbone
    # Before the cut, which calls the first layer once more.
    hidden = first_layer_input(backbone)
    try:
        model = cut(backbone, found.start, found.end, found.last, from_embeddings=True)
    except UnsupportedParallelismError as error:
        raise PromptEmbedsError(
            f"{type(backbone).__name__} cannot take prompt embeddings: its layers "
            f"need more than the hidden states entering the first one ({error})."
        ) from error
    try:
        # Stateless, as `_cut`: the weights may not be loaded yet.
        with keras.StatelessScope(initialize_variables=False):
            embedding = keras.Model(backbone.input["token_ids"], hidden, name="embedding")
    except ValueError as error:
        raise PromptEmbedsError(
            f"{type(backbone).__name__} cannot take prompt embeddings: what enters "
            f"its first transformer layer is made from more than its token ids ({error})."
        ) from error
    token_embedding = attention.token_embedding(backbone)
    weighted = [
        layer.name
        for layer in embedding._flatten_layers(include_self=False, recursive=False)
        if layer is not token_embedding and layer.weights
    ]
    if weighted:
        raise PromptEmbedsError(
            f"{type(backbone).__name__} cannot take prompt embeddings: between its "
            f"token embedding and its first transformer layer it runs {weighted}, "
            "which vLLM's own models run after the prompt embeddings."
        )
    return dataclasses.replace(found, model=model, embedding=embedding)

"""A backbone's forward pass on text tokens alone.

Most backbones take `token_ids` and `padding_mask` and nothing else. The
functional graphs of multimodal Gemma3n and Gemma4 presets (all their
published ones), of Gemma3's vision presets (`gemma3_4b` and up) and of
PaliGemma also demand image and audio inputs, so for those the path their
own `CausalLM.call_with_cache` runs is used instead, with no cache: the
same layers in the same order as the full graph: each such family's
`text_forward`, in its module under `families/`.
"""

from vllm_keras_hub import families


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    """Final hidden states of `backbone` for `token_ids`.

    Args:
        backbone: A loaded KerasHub backbone.
        token_ids: `(batch, length)` token ids.
        padding_mask: `(batch, length)` ones where a token is real.
        positions: `(batch, length)` position of each token.
        layers: `(start, end)`: run only these transformer layers, a
            pipeline stage of a backbone whose text path is a loop over its
            layers (Gemma3 and Qwen3.5 vision presets, Gemma4); `pipeline.py`
            cuts the others.
        hidden: The hidden states entering layer `start`; at layer 0, the
            input embeddings of a preset served with images, images merged
            in (`images.py`). Gemma4 then needs `token_ids` zero at its
            image tokens, as its graph makes them for its per-layer inputs.
            A Gemma4 stage after the first takes its per-layer inputs
            beside the hidden states.

    Returns:
        `(batch, length, hidden_size)` hidden states; from a Gemma4 stage
        before the last, with its per-layer inputs beside them.
    """
    family = families.family_for_backbone(type(backbone).__name__)
    if family.text_forward is not None:
        hidden_states = family.text_forward(
            backbone, token_ids, padding_mask, positions, layers, hidden
        )
        if hidden_states is not None:
            return hidden_states
    return backbone(
        {"token_ids": token_ids, "padding_mask": padding_mask}, training=False
    )

"""Qwen3.5's M-RoPE route: the same bits as the layer's own `_apply_mrope`."""

import pytest
import torch
from keras_hub.src.models.qwen3_5.qwen3_5_attention import Qwen3_5Attention

from vllm_keras_hub.layers import step
from vllm_keras_hub.families.qwen3_5 import mrope_cos_sin
from vllm_keras_hub.families.qwen3_5 import mrope_rotate

# `(temporal, height, width)` rows of 11 tokens, as `media.py` gives
# them: two text tokens, a 2x3 image at position 2 (its rows and columns in
# the second and third rows), the text after it from 2 + 3, and two tokens
# far out, one with three different rows.
MROPE = [
    [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 70000],
    [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 70013],
    [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 69991],
]


def _layer(dtype):
    # The published presets' rotary settings: a quarter of a 256-wide head,
    # its 32 frequencies interleaved 11 (t), 11 (h), 10 (w).
    layer = Qwen3_5Attention(
        num_query_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        partial_rotary_factor=0.25,
        rope_max_wavelength=10_000_000,
        mrope_section=[11, 11, 10],
        dtype=dtype,
    )
    layer.build((None, None, 64))
    return layer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mrope_rotation_equals_the_layers_apply_mrope(dtype):
    layer = _layer(dtype)
    mrope = torch.tensor(MROPE)
    tokens = mrope.shape[1]
    # KerasHub's layout: a batch of one, channels (text, t, h, w), the text
    # channel unused by `_apply_mrope`.
    position_ids = torch.cat([mrope[:1], mrope])[None].to(torch.int32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), step.scope(rotary_rows={}):
        for heads in (layer.num_query_heads, layer.num_key_value_heads):
            # Serving-shaped: one row per token, `(tokens, 1, heads, head_dim)`.
            x = torch.randn(tokens, 1, heads, layer.head_dim, generator=generator)
            x = x.to(getattr(torch, dtype))
            cos, sin = mrope_cos_sin(layer, mrope)
            got = mrope_rotate(x, cos, sin, layer.rotary_dim)
            want = layer._apply_partial_rope(x.reshape(1, tokens, heads, -1), 0, position_ids)
            assert got.dtype == want.dtype == x.dtype
            assert torch.equal(got.reshape(want.shape), want)
        # Computed once a step, for every layer alike.
        assert len(step.current().rotary_rows) == 1

"""The vLLM 0.32 CPU punica bug that `keep_a_zero_slot` works around.

The served proof is `lora/adapters_test.py`: base rows beside adapter rows
in one batch give the base model's tokens (without the workaround, 5 of 6
base rows changed). These tests pin the bug itself, on vLLM's own op.
"""

import types

import torch
from vllm.lora.ops.torch_ops.lora_ops import bgmv_shrink

from vllm_keras_hub.vllm_fixes.punica_zero_slot import keep_a_zero_slot

NO_ADAPTER = -1


def _stacked():
    # Two adapter slots, (slots, 1, rank 2, in 3): slot 0 zeros, slot 1 ones.
    return torch.stack([torch.zeros(1, 2, 3), torch.ones(1, 2, 3)])


def _shrink(stacked, indices):
    x = torch.ones(len(indices), 3)
    y = torch.zeros(len(indices), 2)
    bgmv_shrink(x, stacked, y, torch.tensor(indices))
    return y


def test_vllms_cpu_op_gives_a_row_without_adapter_the_last_slot():
    """If this fails, vLLM fixed the bug: remove the workaround."""
    y = _shrink(_stacked(), [0, NO_ADAPTER])
    assert not y[0].any()
    assert torch.equal(y[1], torch.full((2,), 3.0))  # slot 1's adapter


def test_a_zero_slot_gives_rows_without_adapter_nothing():
    layer = types.SimpleNamespace(lora_a_stacked=(_stacked(),), lora_b_stacked=(_stacked(),))
    keep_a_zero_slot(types.SimpleNamespace(modules={"lora_layers.0": layer}))
    (stacked,) = layer.lora_a_stacked
    assert stacked.shape[0] == 3
    y = _shrink(stacked, [NO_ADAPTER, 1, 0])
    assert not y[0].any()
    assert torch.equal(y[1], torch.full((2,), 3.0))
    assert not y[2].any()

"""vLLM 0.32's CPU LoRA ops give a row without an adapter the last slot's."""

import torch


def keep_a_zero_slot(manager):
    """Works around vLLM 0.32's CPU punica ops giving base rows an adapter.

    vLLM marks a token without an adapter with slot index -1. Its GPU
    kernels skip such tokens; its CPU ops (`lora/ops/torch_ops/lora_ops.py`)
    index the stacked adapter weights with it, which selects the last slot,
    so in a batch that mixes base and adapter requests the base rows got
    the last slot's adapter. Each wrapped layer gets one more, always-zero
    slot at the end, past the `max_loras` slots vLLM fills: -1 selects it,
    and adds exactly zero.

    Remove when vLLM's CPU LoRA ops skip slot -1 as its GPU kernels do;
    `punica_zero_slot_test.py` then fails its first test.

    Args:
        manager: The `LoRAModelManager` vLLM made for the model.
    """
    for module in manager.modules.values():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            stacked = getattr(module, name, None)
            if stacked is None:
                continue
            setattr(
                module,
                name,
                tuple(torch.cat([t, torch.zeros_like(t[:1])]) for t in stacked),
            )

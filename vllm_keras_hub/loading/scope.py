"""Where a model class builds its vLLM layers at load."""

import contextlib

import torch
from vllm.config import set_current_vllm_config


def building_scope(vllm_config):
    """The engine's config and device, as vLLM's layers read them when built.

    Args:
        vllm_config: The engine's `VllmConfig`.
    """
    scope = contextlib.ExitStack()
    scope.enter_context(set_current_vllm_config(vllm_config))
    scope.enter_context(torch.device(vllm_config.device_config.device))
    return scope

"""KerasHub samplers translated into vLLM sampling settings.

vLLM samples inside the engine, so a preset's own KerasHub sampler is honoured
by translating it: into `SamplingParams` keyword arguments, and into the
`generation_config.json` fields from which vLLM takes its default sampling
(for `LLM.generate` without `SamplingParams` and for unset fields of OpenAI
requests).
"""

import inspect

from keras_hub.src.models.causal_lm import CausalLM
from keras_hub.src.samplers.serialization import get as get_sampler
from keras_hub.src.utils.preset_utils import list_subclasses
from keras_hub.src.vllm.registry import sampler_to_sampling_kwargs


def sampling_kwargs(sampler):
    """Maps a KerasHub sampler to `vllm.SamplingParams` keyword arguments.

    Greedy is `temperature=0`; top-k is `top_k` and `temperature`; top-p is
    `top_p`, `temperature` and `top_k` when the sampler has one; random is
    `temperature`; a sampler's seed becomes `seed`.

    Args:
        sampler: A `keras_hub.samplers.Sampler` instance or its name
            (`"greedy"`, `"top_k"`, ...).

    Raises:
        ValueError: for samplers vLLM has no equivalent of (beam,
            contrastive), rather than silently sampling differently.
    """
    sampler = get_sampler(sampler)
    kwargs = sampler_to_sampling_kwargs(sampler)
    if kwargs is None:
        raise ValueError(
            f"KerasHub's {type(sampler).__name__} has no vLLM SamplingParams "
            "equivalent; pass explicit SamplingParams instead."
        )
    return kwargs


def causal_lm_class(preset):
    """The concrete `CausalLM` subclass that serves `preset`.

    The preset's backbone class decides it, as in KerasHub's
    `Task.from_preset`, without building anything. KerasHub bug: its
    `find_subclass` returns the first match while iterating a `set` of
    classes, so where two `CausalLM`s take one backbone (`Gemma4CausalLM` and
    the speculative-decoding drafter `Gemma4AssistantCausalLM`), which one
    `CausalLM.from_preset` builds changes from process to process. Here the
    choice is fixed: drafters (`*AssistantCausalLM`) are never served, and of
    the rest the first by name.
    """
    from vllm_keras_hub.preset import Preset

    backbone_cls = Preset.of(preset).backbone_cls
    candidates = sorted(
        (
            cls
            for cls in list_subclasses(CausalLM)
            if cls.backbone_cls == backbone_cls
            and not cls.__name__.endswith("AssistantCausalLM")
        ),
        key=lambda cls: cls.__name__,
    )
    if not candidates:
        raise ValueError(
            f"No KerasHub CausalLM takes {backbone_cls.__name__} (preset "
            f"'{preset}')."
        )
    return candidates[0]


def default_sampler(causal_lm_cls):
    """The sampler a `CausalLM` class compiles with by default.

    Read from the concrete class's `compile` signature: Gemma-family tasks
    override the base class's `"top_k"` with `"greedy"`.
    """
    default = inspect.signature(causal_lm_cls.compile).parameters["sampler"].default
    return get_sampler(default)


def generation_config_fields(sampler):
    """`generation_config.json` fields that make vLLM default to `sampler`.

    Args:
        sampler: A `keras_hub.samplers.Sampler` instance or name.
    """
    kwargs = sampling_kwargs(sampler)
    kwargs.pop("seed", None)  # No generation_config field carries a seed.
    fields = {"do_sample": kwargs["temperature"] > 0}
    fields.update(kwargs)
    return fields

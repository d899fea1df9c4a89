"""Workarounds for vLLM 0.32 bugs: one file each, this index, one place to apply.

Every fix patches vLLM only where a KerasHub model is served, and says when
it can go. `apply_for_model` applies the ones a model's build needs, from
the model's constructor; the two that act elsewhere say where in `applied`.
`vllm_fixes_test.py` checks that every file here is indexed and that every
proof named here exists.
"""

import dataclasses

from vllm.platforms import current_platform

from vllm_keras_hub.vllm_fixes import audio_integer_samples
from vllm_keras_hub.vllm_fixes import kv_sharing_uniform_specs
from vllm_keras_hub.vllm_fixes import pipeline_eager_buffer
from vllm_keras_hub.vllm_fixes import punica_zero_slot
from vllm_keras_hub.vllm_fixes import saved_compile


@dataclasses.dataclass(frozen=True)
class Fix:
    """One vLLM bug we work around.

    Args:
        module: The file under `vllm_fixes/` holding the fix.
        bug: What vLLM 0.32 does wrong.
        applied: Where and when the fix is applied.
        proof: The test that fails without the fix (a node id).
        remove_when: What upstream change makes the fix unnecessary.
    """

    module: str
    bug: str
    applied: str
    proof: str
    remove_when: str


FIXES = (
    Fix(
        "audio_integer_samples",
        "the PyAV audio loader returns 16/32-bit integer samples unscaled at "
        "a file's own rate, which is how the server loads every clip",
        "front end: `models/multimodal.py` and `tasks/audio_to_text/processor.py` "
        "at import, before any clip is decoded",
        "vllm_keras_hub/vllm_fixes/audio_integer_samples_test.py"
        "::test_integer_samples_at_their_own_rate_are_scaled",
        "`load_audio_pyav` converts integer frames to float at any rate",
    ),
    Fix(
        "kv_sharing_uniform_specs",
        "KV-sharing layers in one unified KV cache group (hybrid KV cache "
        "manager off, or a KV connector) fail `initialize_attn_backend` with a "
        "KeyError: Gemma4 could not start",
        "`apply_for_model`",
        "tests/disaggregation_test.py::test_a_consumer_decodes_from_the_producers_kv",
        "`add_kv_sharing_layers_to_kv_cache_groups` records shared layers in a "
        "`UniformTypeKVCacheSpecs`",
    ),
    Fix(
        "pipeline_eager_buffer",
        "the CPU runner never makes a later pipeline stage's intermediate "
        "buffer in eager mode, so every later stage asserts at its first step",
        "`apply_for_model`, with more than one pipeline stage on the CPU",
        "vllm_keras_hub/models/pipeline_test.py::test_two_stages_are_the_whole_model",
        "`CPUModelRunner` makes `intermediate_tensors` without `_dummy_run`",
    ),
    Fix(
        "punica_zero_slot",
        "the CPU LoRA ops give a row without an adapter (slot -1) the last "
        "slot's adapter",
        "`KerasHubForCausalLM.lora_manager`, once vLLM has wrapped the LoRA layers",
        "vllm_keras_hub/vllm_fixes/punica_zero_slot_test.py"
        "::test_vllms_cpu_op_gives_a_row_without_adapter_the_last_slot",
        "the CPU LoRA ops skip slot -1 as the GPU kernels do",
    ),
    Fix(
        "saved_compile",
        "the CPU build never loads the compile it saved: the plain Inductor "
        "backend's functions have no `finalize_loading`",
        "`apply_for_model`, before vLLM's first compiled call",
        "vllm_keras_hub/vllm_fixes/saved_compile_test.py"
        "::test_a_restart_loads_the_saved_compile_and_serves_the_presets_weights",
        "the plain backend's functions have `finalize_loading`, or the loader "
        "stops calling it for them",
    ),
)


def apply_for_model(model_class, vllm_config):
    """Applies the fixes a KerasHub model's build needs, each once a process.

    Args:
        model_class: The vLLM model class being built.
        vllm_config: The engine's `VllmConfig`.
    """
    if vllm_config.parallel_config.pipeline_parallel_size > 1 and current_platform.is_cpu():
        pipeline_eager_buffer.keep_intermediate_buffer_in_eager_mode(model_class)
    kv_sharing_uniform_specs.give_shared_layers_their_specs()
    saved_compile.load_saved_compiles(model_class)


__all__ = ["FIXES", "Fix", "apply_for_model", "audio_integer_samples", "punica_zero_slot"]

"""Benchmark only: vLLM 0.32's saved-compile loader fixed for every model.

`bench/run.py` puts this folder on PYTHONPATH for one extra start of vLLM
native, so Python runs it in each of that engine's processes. It applies to
native models the no-op `vllm_keras_hub/vllm_fixes/saved_compile.py` applies to ours
(vLLM's CPU build calls `finalize_loading()` on a loaded compile that has
none), so the run can also compare restarts with the bug fixed on both sides.
"""

from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

if not hasattr(BundledAOTAutogradSerializableCallable, "finalize_loading"):
    BundledAOTAutogradSerializableCallable.finalize_loading = (
        lambda self, vllm_config: None
    )

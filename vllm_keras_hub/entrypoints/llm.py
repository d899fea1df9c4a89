"""`KerasHubLLM`: a `vllm.LLM` that also accepts `keras_hub:<preset>`."""

import os

import msgspec
import vllm

from vllm_keras_hub import backend

# Before the imports below import Keras: a user's fresh shell names no
# backend. (Not at package import: vLLM imports the package, our plugin, in
# every process, for every model.)
backend.default_to_torch()

from vllm_keras_hub.entrypoints.prepare import prepare  # noqa: E402
from vllm_keras_hub.export.preset_folder import strip_prefix  # noqa: E402
from vllm_keras_hub.lora import adapters as lora_adapters  # noqa: E402
from vllm_keras_hub.plugin import register  # noqa: E402


class KerasHubLLM(vllm.LLM):
    """A `vllm.LLM` that serves KerasHub presets.

    `KerasHubLLM("keras_hub:<preset>", **vllm_kwargs)` accepts anything
    `keras_hub.models.CausalLM.from_preset` does: a Kaggle handle,
    `kaggle://...`, `hf://...`, or a local preset folder. It writes a
    temporary model folder (config, exported tokenizer and generation config;
    no weights), removed on `close()`, garbage collection or exit. Weights are
    loaded once, from the preset, by the `keras_hub` load format. Without
    `SamplingParams`, `generate` samples with the preset's own KerasHub
    sampler (greedy for Gemma families, top-k 5 for most others), from the
    folder's `generation_config.json`. Any other model string goes to
    `vllm.LLM` unchanged.

    With `enable_lora=True`, a `LoRARequest` may name a KerasHub `.lora.h5`
    file as its `lora_path`, for adapters chosen per request; it is
    converted to vLLM's form once (`lora/adapters.py`). A file that does not
    fit the preset raises `LoraAdapterError` (vLLM aborts the rows of that
    call it had queued).

    Args:
        model: `"keras_hub:<preset>"`, or any model `vllm.LLM` takes.
        lora_weights: A KerasHub LoRA adapter of the preset (the
            `.lora.h5` file of `backbone.save_lora_weights`), merged into
            its kernels at load.
        **kwargs: `vllm.LLM` arguments (`max_model_len`, `dtype`,
            `max_num_batched_tokens`, ...).
    """

    def __init__(self, model, lora_weights=None, **kwargs):
        self.model_folder = None
        self.draft_folder = None
        preset = self._preset = strip_prefix(model)
        self._adapter_folders = {}
        if lora_weights is not None and preset is None:
            raise ValueError(
                f"lora_weights merges a KerasHub adapter into a 'keras_hub:<preset>' "
                f"model, not into {model!r}."
            )
        if preset is not None:
            register()
            prepared = prepare(preset, kwargs, set(kwargs), lora_weights)
            self.model_folder, self.draft_folder = prepared.folder, prepared.draft
            kwargs.update(prepared.updates)
            model = self.model_folder.path
        try:
            super().__init__(model=model, **kwargs)
        except BaseException:
            self.close()
            raise

    def _add_request(self, prompt, params, lora_request=None, priority=0):
        # vLLM's one funnel for every offline request (`generate`, `chat`).
        return super()._add_request(
            prompt, params, self._vllm_lora_request(lora_request), priority
        )

    def _vllm_lora_request(self, request):
        """`request`, pointed at its vLLM folder if it names a KerasHub file."""
        if (
            request is None
            or self._preset is None
            or not lora_adapters.is_keras_hub_adapter(request.lora_path)
        ):
            return request
        lora_config = self.llm_engine.vllm_config.lora_config
        if lora_config is None:
            return request  # vLLM refuses it: LoRA is not enabled.
        path = os.path.abspath(request.lora_path)
        stat = os.stat(path) if os.path.isfile(path) else None
        key = (path, stat and (stat.st_mtime_ns, stat.st_size))
        if key not in self._adapter_folders:
            self._adapter_folders[key] = lora_adapters.peft_folder(
                self._preset, path, lora_config.max_lora_rank
            )
        return msgspec.structs.replace(request, lora_path=self._adapter_folders[key])

    def close(self):
        """Shuts the engine down and removes the temporary model folder."""
        engine = getattr(self, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
        for folder in (self.model_folder, self.draft_folder):
            if folder is not None:
                folder.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

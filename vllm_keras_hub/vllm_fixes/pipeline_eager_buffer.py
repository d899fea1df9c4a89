"""vLLM 0.32's CPU runner fails later pipeline stages in eager mode."""


def keep_intermediate_buffer_in_eager_mode(model_class):
    """Works around vLLM 0.32's CPU runner failing pipeline stages eagerly.

    A later stage's runner receives the previous stage's hidden states into
    a buffer (`sync_and_gather_intermediate_tensors`) that only its warm-up
    (`_dummy_run`) creates. vLLM's CPU worker skips that warm-up in eager
    mode (`enforce_eager`, and under `VLLM_CPU_CI_ENV`), so every later
    stage asserted at its first step, for vLLM's own models too. This makes
    the buffer where `_dummy_run` would have, for `model_class` only.

    Remove when vLLM's CPU worker makes that buffer in eager mode itself
    (`CPUModelRunner` setting `intermediate_tensors` without `_dummy_run`).

    Args:
        model_class: The vLLM model class whose later stages get the buffer.
    """
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if getattr(CPUModelRunner, "_keras_hub_buffer", False):
        return
    gather = CPUModelRunner.sync_and_gather_intermediate_tensors

    def sync_and_gather_intermediate_tensors(self, *args, **kwargs):
        model = self.get_model()
        if self.intermediate_tensors is None and isinstance(model, model_class):
            self.intermediate_tensors = model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens,
                dtype=self.model_config.dtype,
                device=self.device,
            )
        return gather(self, *args, **kwargs)

    CPUModelRunner.sync_and_gather_intermediate_tensors = (
        sync_and_gather_intermediate_tensors
    )
    CPUModelRunner._keras_hub_buffer = True

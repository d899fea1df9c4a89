"""vLLM's scheduler, never splitting the rest of an image over two steps.

With `disable_chunked_mm_input`, vLLM's scheduler stops a prefill before an
image that does not fit in the step, when none of the image is computed
yet. A prefill that starts at the image's first token, or inside it after a
prefix-cache hit that ends there, can still be cut before the image's end,
and the image's bidirectional attention (`layers/attention/image_attention.py`) would
then miss its later tokens. This scheduler computes nothing of such a
request in that step; it goes on in a later one, whole.
"""

from vllm.v1.core.sched.scheduler import Scheduler

# What `--scheduler-cls` takes.
IMAGE_SCHEDULER = "vllm_keras_hub.scheduler.ImageScheduler"


class ImageScheduler(Scheduler):
    """vLLM's `Scheduler`, holding back a cut image's rest for a later step."""

    def _try_schedule_encoder_inputs(
        self,
        request,
        num_computed_tokens,
        num_new_tokens,
        encoder_compute_budget,
        shift_computed_tokens=0,
    ):
        end_of_step = num_computed_tokens + num_new_tokens
        for feature in request.mm_features or ():
            start = feature.mm_position.offset
            end = start + feature.mm_position.length
            if start <= num_computed_tokens < end and end_of_step < end:
                return [], 0, encoder_compute_budget, [], []
        return super()._try_schedule_encoder_inputs(
            request,
            num_computed_tokens,
            num_new_tokens,
            encoder_compute_budget,
            shift_computed_tokens,
        )

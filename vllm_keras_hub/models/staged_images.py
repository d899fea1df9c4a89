"""Images under pipeline parallelism: the encoders on the first stage.

vLLM runs the media encoders and merges their embeddings on the first
pipeline stage only (`gpu_model_runner._preprocess`), and only that stage
holds them (`pipeline.py`). Where a preset's images attend bidirectionally,
each later stage must still know which of the step's rows are image rows
(`image_attention.py`), which it learns from the stage before: a column of
flags crosses beside the hidden states (`image_attention.flag_column`).
"""

import torch
from vllm.sequence import IntermediateTensors

from vllm_keras_hub.layers.attention import image_attention


def no_embeddings(fields, hidden_size, dtype):
    """`embed_multimodal` on a stage after the first: one empty embedding an
    item. vLLM's profile run calls every stage's encoder, though only the
    first stage's embeddings are used, and only it has one.

    Args:
        fields: `embed_multimodal`'s fields.
        hidden_size: The embeddings' width.
        dtype: Their dtype.
    """
    for name in ("input_features", "video_pixel_values", "pixel_values"):
        if fields.get(name) is not None:
            return tuple(torch.empty(0, hidden_size, dtype=dtype) for _ in fields[name])
    return []


class ImagesInStages:
    """The image-row column of a multimodal model's pipeline stages.

    A mixin before `KerasHubForCausalLM`, for a model with `image` (its
    `keras_hub_image` format), `stage` and `prefix_lm`.
    """

    def _crossing_width(self, stage):
        return super()._crossing_width(stage) + int(self._sends_image_rows(stage))

    def _sends_image_rows(self, stage):
        return stage.size > 1 and bool(self.image["bidirectional"])

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        """The base model's `forward`; with bidirectional images, each stage
        but the last sends the step's image rows beside its hidden states,
        and the next attends by them."""
        if not self._sends_image_rows(self.stage):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        if not self.stage.first:
            hidden = intermediate_tensors["hidden_states"]
            image_attention.set_step_from_column(hidden[:, -1:], self.prefix_lm)
            intermediate_tensors = IntermediateTensors({"hidden_states": hidden[:, :-1]})
        output = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        if self.stage.last:
            return output
        hidden = output["hidden_states"]
        column = image_attention.flag_column(hidden.shape[0]).to(hidden)
        return IntermediateTensors({"hidden_states": torch.cat([hidden, column], -1)})

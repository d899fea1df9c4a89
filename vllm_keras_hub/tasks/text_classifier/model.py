"""The vLLM pooling model class of KerasHub text classifiers."""

from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
from vllm.model_executor.layers.pooler.seqwise.poolers import pooler_for_classify
from vllm.model_executor.layers.pooler.special import DispatchPooler
from vllm.model_executor.models.bert import _decode_token_type_ids
from vllm.model_executor.models.bert import _encode_token_type_ids
from vllm.model_executor.models.interfaces import SupportsCrossEncoding
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.interfaces_base import default_pooling_type

from vllm_keras_hub.layers import step
from vllm_keras_hub.models.base import KerasHubBase
from vllm_keras_hub.models.base import compiled
from vllm_keras_hub.tasks.text_classifier import TASK
from vllm_keras_hub.tasks.text_classifier import head as head_lib


class ClassifierMixin:
    """vLLM's classify pooler over the first token's final hidden state,
    then the preset's own head (its settings checked by the base,
    `settings.verify`: no adapters, drafts or stages)."""

    is_pooling_model = True
    # Every token attends to the whole text, through vLLM's encoder-only kind.
    encoder_only = True

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.classifier = getattr(vllm_config.model_config.hf_config, TASK.field)
        self.pooler = None
        self.head = None

    def _load(self, backbone, weights, lora_weights):
        # The head's graph is wired on the backbone before its layers route
        # to vLLM; its weights are read now, the backbone's by the base.
        task = head_lib.build_task(self.preset, backbone, self.classifier)
        super()._load(backbone, weights, lora_weights)
        self.head = head_lib.Head(task, self.classifier["head"])
        with self._vllm_scope():
            self.pooler = DispatchPooler(
                {
                    "classify": pooler_for_classify(
                        self.vllm_config.model_config.pooler_config,
                        pooling=get_seq_pooling_method("CLS"),
                        classifier=self.head,
                    )
                }
            )

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if not self.classifier["segment_ids"]:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        # The segment ids ride in the token ids' high bits (`SegmentIds`);
        # BERT's `text_forward` reads them from the step.
        segment_ids = _decode_token_type_ids(input_ids)
        with step.scope(segment_ids=segment_ids):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states):
        raise NotImplementedError("A text classifier pools; it generates no tokens.")


class SegmentIds:
    """Takes vLLM's `token_type_ids` (a scored pair's segment ids) into the
    token ids' high bits, as vLLM's own BERT does, before the compiled
    `forward`: its graph, compiled without them, keeps one signature."""

    def __call__(self, input_ids, positions, intermediate_tensors=None,
                 inputs_embeds=None, token_type_ids=None):  # fmt: skip
        if token_type_ids is not None:
            _encode_token_type_ids(input_ids, token_type_ids)
        return super().__call__(input_ids, positions, intermediate_tensors, inputs_embeds)


# `SupportsPP` leaves the refusal of pipeline parallelism to
# `settings.check_pooling_settings`, which names the reason.
# `SupportsCrossEncoding`, as vLLM's own classifiers: one-output presets
# score pairs (vLLM turns scoring on for one label only).
@compiled
@default_pooling_type(seq_pooling_type="CLS")
class _KerasHubClassifier(ClassifierMixin, KerasHubBase, SupportsCrossEncoding, SupportsPP):
    pass


# `compiled` sets its class's `__call__`; `SegmentIds` wraps it from a subclass.
class KerasHubForSequenceClassification(SegmentIds, _KerasHubClassifier):
    """A KerasHub `TextClassifier` preset served by vLLM's pooling runner.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config`
            carries the preset's `keras_hub_classifier` fields.
        prefix: Module prefix vLLM gives the model.
    """

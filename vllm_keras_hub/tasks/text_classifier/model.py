"""The vLLM pooling model class of KerasHub text classifiers."""

from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
from vllm.model_executor.layers.pooler.seqwise.poolers import pooler_for_classify
from vllm.model_executor.layers.pooler.special import DispatchPooler
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.interfaces_base import default_pooling_type

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

    def compute_logits(self, hidden_states):
        raise NotImplementedError("A text classifier pools; it generates no tokens.")


# `SupportsPP` leaves the refusal of pipeline parallelism to
# `settings.check_pooling_settings`, which names the reason.
@compiled
@default_pooling_type(seq_pooling_type="CLS")
class KerasHubForSequenceClassification(ClassifierMixin, KerasHubBase, SupportsPP):
    """A KerasHub `TextClassifier` preset served by vLLM's pooling runner.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config`
            carries the preset's `keras_hub_classifier` fields.
        prefix: Module prefix vLLM gives the model.
    """

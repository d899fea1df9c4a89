"""KerasHub `TextClassifier` presets on vLLM's pooling runner: `LLM.classify`, `/classify`.

The preset's own backbone runs with its attention on vLLM's encoder-only
kernel; vLLM's pooling takes each text's first token's state, as the
preset's classifier does, and hands it to the preset's own head
(`head.py`): its dense layers, dropout off, the last one's activation left
to vLLM's pooler, which applies the one the preset uses (`spec.py`). What
a preset tells vLLM is read in `spec.py`; `model.py` serves it.
"""

from vllm_keras_hub.tasks import PoolingTask

TASK = PoolingTask(
    name="text_classifier",
    field="keras_hub_classifier",
    architecture="KerasHubTorchForSequenceClassification",
    model_class=(
        "vllm_keras_hub.tasks.text_classifier.model:KerasHubForSequenceClassification"
    ),
    reader="vllm_keras_hub.tasks.text_classifier.spec:read_classifier",
    endpoint="/classify",
)

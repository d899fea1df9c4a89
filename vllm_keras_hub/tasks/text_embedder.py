"""KerasHub `TextEmbedder` presets, and EmbeddingGemma backbones, on `/v1/embeddings`.

How a preset pools is read in `export/embedder.py`; `models/pooling.py`
serves it.
"""

from vllm_keras_hub.tasks import PoolingTask

TASK = PoolingTask(
    name="text_embedder",
    field="keras_hub_embedder",
    architecture="KerasHubTorchForEmbedding",
    model_class="vllm_keras_hub.models.pooling:KerasHubForEmbedding",
    reader="vllm_keras_hub.export.embedder:read_embedder",
    endpoint="/v1/embeddings",
    former_architectures=("KerasHubForEmbedding",),
)

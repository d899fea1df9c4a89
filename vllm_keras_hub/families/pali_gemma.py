"""PaliGemma: vision-language, prefix-LM, on keras-hub's Gemma route.

Every prompt is an image and its text, attended bidirectionally; the output
causally (`models/prefix_lm.py`).
"""

from vllm_keras_hub.families.family import Family


FAMILY = Family(
    "pali_gemma",
    "PaliGemma",
    "PaliGemmaBackbone",
    tensor_parallel=True,
    pipeline_refusal=(
        "its prefix (the image and the prompt, attended both ways) is not "
        "placed in pipeline stages yet"
    ),
)

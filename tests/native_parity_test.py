"""Cross-check against vLLM's native Llama on the same SmolLM2 weights.

The SmolLM2 preset's weights, exported to a Hugging Face `LlamaForCausalLM`
folder, run through vLLM's own `LlamaForCausalLM`; the preset itself runs
through vllm-keras-hub. Same engine settings, same prompts, greedy.
"""

import numpy as np
import pytest
from vllm import LLM
from vllm import SamplingParams

from vllm_keras_hub import smollm2
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5,",
    "The largest planet in our solar system",
    "Translate to French: good morning",
    "In machine learning, a transformer is",
]
MAX_NEW_TOKENS = 24
# Chosen-token logprob differences between two float32 implementations of
# the same model (different matmul blocking and attention kernels):
# measured at most 2e-5 on this machine; the bound is five times that.
LOGPROB_TOLERANCE = 1e-4
SETTINGS = dict(TEST_ENGINE_KWARGS, max_model_len=512, enforce_eager=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, logprobs=1)


@pytest.fixture(scope="module")
def preset():
    return smollm2.default_preset_dir()


def run(llm):
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [
        [
            step[token].logprob
            for step, token in zip(o.outputs[0].logprobs, ids, strict=True)
        ]
        for o, ids in zip(outputs, tokens, strict=True)
    ]
    return [o.prompt_token_ids for o in outputs], tokens, logprobs


def test_same_tokens_and_logprobs_as_vllm_native_llama(preset, tmp_path):
    hf_folder = str(tmp_path / "hf")
    smollm2.export_hf_llama(preset, hf_folder)
    with in_process_engine_env():
        native = LLM(hf_folder, distributed_executor_backend="uni", **SETTINGS)
        native_prompts, native_tokens, native_logprobs = run(native)
        native.llm_engine.engine_core.shutdown()
        del native
    with in_process_llm(f"keras_hub:{preset}", **SETTINGS) as llm:
        prompts, tokens, logprobs = run(llm)

    assert prompts == native_prompts
    assert tokens == native_tokens
    differences = [
        abs(a - b)
        for xs, ys in zip(logprobs, native_logprobs, strict=True)
        for a, b in zip(xs, ys, strict=True)
    ]
    print(
        f"\n{len(PROMPTS)} prompts x {MAX_NEW_TOKENS} tokens identical; chosen-token "
        f"logprob |diff| max {max(differences):.2e}, mean {np.mean(differences):.2e}"
    )
    assert max(differences) < LOGPROB_TOLERANCE

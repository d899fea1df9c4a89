"""Correct under KV-cache pressure: vLLM's preemption and recompute.

With a KV cache of a few blocks, running requests run out of blocks as they
grow, and vLLM preempts some (frees their blocks) and later recomputes them
from their tokens. Served greedy tokens must equal an unpressured run's, for
a sliding-window family (Mistral) and a KV-sharing one (Gemma4: sliding and
full layers in two KV-cache groups, shared layers without a cache), and
every block must be free afterwards. vLLM's own preemption counter proves
that preemption happened; the test prints how often.
"""

import pytest
from vllm import SamplingParams

from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.presets import build_tiny_preset

# 12 prompts of 20 to 70 tokens, each growing past a 128-token KV block.
PROMPTS = [
    f"Request {i}: the quick brown fox jumps over the lazy dog "
    + "and keeps running " * (1 + i % 6)
    for i in range(12)
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
MAX_MODEL_LEN = 256
# A few more than one request of MAX_MODEL_LEN needs. Gemma4's two KV-cache
# groups (sliding and full layers) draw from one pool of blocks.
PRESSURED_BLOCKS = {"mistral": 4, "gemma4": 8}


def engine_state(llm):
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    return core.scheduler, runner.kv_cache_config


def preemptions(llm):
    return sum(
        metric.value
        for metric in llm.get_metrics()
        if metric.name == "vllm:num_preemptions"
    )


@pytest.mark.parametrize("family", ["mistral", "gemma4"])
def test_preempted_requests_recompute_the_unpressured_tokens(family, tmp_path, capsys):
    preset = f"keras_hub:{build_tiny_preset(family, str(tmp_path))}"
    with in_process_llm(preset, max_model_len=MAX_MODEL_LEN) as llm:
        expected = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        _, config = engine_state(llm)
        bytes_per_block = llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes
        bytes_per_block //= config.num_blocks
    assert max(len(o.prompt_token_ids) for o in expected) + GREEDY.max_tokens > 128
    with in_process_llm(
        preset,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=PRESSURED_BLOCKS[family] * bytes_per_block,
        disable_log_stats=False,
    ) as llm:
        scheduler, config = engine_state(llm)
        assert config.num_blocks == PRESSURED_BLOCKS[family]
        before = preemptions(llm)
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        caused = preemptions(llm) - before
        usage = scheduler.kv_cache_manager.usage
        unfinished = scheduler.get_num_unfinished_requests()
    with capsys.disabled():
        blocks = PRESSURED_BLOCKS[family]
        print(f"\n{family}: {caused:.0f} preemptions in {blocks} KV blocks")
    assert caused > 0, "the KV cache was large enough: nothing was preempted"
    assert [list(o.outputs[0].token_ids) for o in outputs] == [
        list(o.outputs[0].token_ids) for o in expected
    ]
    assert unfinished == 0
    assert usage == 0.0, f"{usage:.1%} of the KV cache still in use once idle"

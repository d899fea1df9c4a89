"""The check a user with an NVIDIA GPU runs: `scripts/gpu-check`.

It has never run on a GPU: no GPU this project can reach can install vLLM.
It was written from vLLM 0.32's CUDA code paths and run on the CPU only as
far as its argument handling goes.

1. Greedy parity on the GPU, in vLLM's default mode there (torch.compile and
   CUDA graphs): each family's tiny random preset, served by vllm-keras-hub,
   must give its own `CausalLM.generate()`'s tokens (the oracle runs on the
   GPU too, in float32), with CUDA graphs captured (vLLM's compilation
   counter).
2. Throughput against vLLM native on the same SmolLM2-135M weights,
   compiled, from the benchmark (`bench/run.py`), as ratios.
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Dense GQA, soft caps and windows, q/k norms, ALiBi, sinks and MoE.
FAMILIES = ("llama3", "gemma2", "qwen3", "mistral", "bloom", "gpt_oss", "qwen3_moe")
PROMPTS = [
    "Hello there",
    "The quick brown fox jumps over the lazy dog.",
    "KerasHub models served by vLLM use a paged KV cache, continuous "
    "batching and chunked prefill.",
]
MAX_NEW_TOKENS = 12


def parity(families):
    """Greedy parity per family with CUDA graphs; returns the failures."""
    import tempfile

    from vllm import SamplingParams
    from vllm.compilation.counter import compilation_counter

    from vllm_keras_hub import KerasHubLLM
    from vllm_keras_hub.testing.engines import in_process_engine_env
    from vllm_keras_hub.testing.oracle import keras_hub_greedy
    from vllm_keras_hub.testing.presets import build_tiny_preset

    failures = []
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    for family in families:
        preset = build_tiny_preset(family, tempfile.mkdtemp(prefix=f"gpu-{family}-"))
        expected = keras_hub_greedy(preset, PROMPTS, MAX_NEW_TOKENS)
        captured = compilation_counter.num_cudagraph_captured
        # In this process, so vLLM's compilation counter here sees the
        # engine's CUDA graphs; a small share of the GPU per engine, one
        # engine after another.
        with in_process_engine_env():
            llm = KerasHubLLM(
                f"keras_hub:{preset}",
                dtype="float32",
                max_model_len=256,
                gpu_memory_utilization=0.3,
                seed=0,
                distributed_executor_backend="uni",
            )
            try:
                mode = llm.llm_engine.vllm_config.compilation_config.cudagraph_mode
                outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
            finally:
                llm.close()
        served = [
            (o.prompt_token_ids, list(o.outputs[0].token_ids)) for o in outputs
        ]
        graphs = compilation_counter.num_cudagraph_captured - captured
        ok = served == expected and graphs > 0
        print(
            f"{family:10s} {'pass' if ok else 'FAIL'}: tokens "
            f"{'equal' if served == expected else 'differ'}, CUDA graph mode "
            f"{getattr(mode, 'name', mode)}, {graphs} graphs captured",
            flush=True,
        )
        if not ok:
            failures.append(family)
    return failures


def throughput(dtypes):
    """The benchmark's SmolLM2 run, vllm-keras-hub against vLLM native."""
    command = [
        sys.executable, os.path.join(ROOT, "bench", "run.py"),
        "--models", "smollm2", "--systems", "keras_hub,native_compiled",
        "--dtypes", dtypes, "--serve", "",
        "--out", os.path.join(ROOT, "bench", "results", "gpu.json"),
    ]  # fmt: skip
    return subprocess.run(command).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            f"No CUDA GPU here (torch {torch.__version__}): run scripts/gpu-check "
            "on an NVIDIA GPU machine, after scripts/setup --cuda."
        )
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    failures = parity(args.families.split(","))
    code = 0 if args.skip_throughput else throughput(args.dtypes)
    if failures:
        raise SystemExit(f"parity failed for {', '.join(failures)}")
    sys.exit(code)


if __name__ == "__main__":
    main()

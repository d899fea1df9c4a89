"""Steps under a server's arrivals: vllm-keras-hub against vLLM native, SmolLM2.

    .venv/bin/python bench/arrivals.py            # about 8 min
    .venv/bin/python bench/arrivals.py --quick    # smoke run

Over HTTP at 8 concurrent requests we are behind native while the offline
engine at 8 requests is level (docs/performance.md). A server's requests
do not arrive together: each joins when a slot frees. This feeds an
in-process engine that way, with no HTTP in between: one new request joins
per step until 8 run, then one for each that finishes (random 32-token
prompts, 32 new tokens, greedy). It times every engine step, apart by
kind: decode only, or with a joining prompt. For contrast, 8 requests
prefilled together and decoded in lockstep. A last run under torch's
profiler gives each system's time per step in its matmul ops.

Both systems compiled, float32, one thread, each in its own subprocess, on
the same weights (SmolLM2-135M-Instruct and its Hugging Face export).
Writes
`bench/results/arrivals.json` and `arrivals.png`.
"""

import argparse
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import worker_result  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
CONCURRENCY = 8
PROMPT_TOKENS = 32
NEW_TOKENS = 32
# The ops our matmuls and native's run in (self time), by profiler name.
MATMUL_OPS = (
    "_C::onednn_mm",
    "vllm_keras_hub::onednn_linear",
)


def worker(system, preset, hf_folder, requests, runs):
    """Step times of `system` under staggered arrivals and in lockstep."""
    import torch
    import vllm
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=1 << 30, seed=0
    )
    if system == "keras_hub":
        from vllm_keras_hub import KerasHubLLM

        llm = KerasHubLLM(f"keras_hub:{preset}", **kwargs)
    else:
        llm = vllm.LLM(hf_folder, **kwargs)
    engine = llm.llm_engine
    rng = random.Random(0)
    params = vllm.SamplingParams(
        temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False
    )
    count = [0]

    def add():
        ids = [rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)]
        engine.add_request(str(count[0]), TokensPrompt(prompt_token_ids=ids), params)
        count[0] += 1

    def staggered():
        steps = {"decode": [], "joining": []}
        add()
        running, started = 1, 1
        while running:
            start = time.perf_counter()
            outputs = engine.step()
            elapsed = (time.perf_counter() - start) * 1000
            joined = any(
                len(o.outputs[0].token_ids) == 1 and not o.finished for o in outputs
            )
            steps["joining" if joined else "decode"].append(elapsed)
            finished = sum(o.finished for o in outputs)
            running -= finished
            # One joins per step until all slots run, then one per finish.
            joining = max(finished, 1 if running < CONCURRENCY else 0)
            for _ in range(min(joining, requests - started, CONCURRENCY - running)):
                add()
                running, started = running + 1, started + 1
        return steps

    def lockstep():
        for _ in range(CONCURRENCY):
            add()
        times = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - start) * 1000)
        return times[1:]  # decode steps, after the prefill of all 8

    staggered()  # warm-up: every shape the runs below step
    result = dict(staggered=[staggered() for _ in range(runs)], lockstep=lockstep())
    with torch.profiler.profile() as profile:
        steps = staggered()
    count_steps = len(steps["decode"]) + len(steps["joining"])
    totals = {event.key: event.self_cpu_time_total for event in profile.key_averages()}
    result["profile_ms_per_step"] = {
        op: totals.get(op, 0.0) / 1000 / count_steps for op in MATMUL_OPS
    }
    result["profile_ms_per_step"]["all ops"] = sum(totals.values()) / 1000 / count_steps
    return result


def _median_of_runs(runs, kind):
    return statistics.median(statistics.median(run[kind]) for run in runs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("SYSTEM", "PRESET", "HF_FOLDER"))
    args = parser.parse_args()
    requests, runs = (12, 1) if args.quick else (40, 3)
    if args.worker:
        from vllm_keras_hub import backend

        backend.default_to_torch()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        worker_result.emit(worker(*args.worker, requests=requests, runs=runs))
        return
    from bench.models import _prepare_smollm2
    from bench.run import worker_env

    env = worker_env(1)
    preset, hf_folder, _ = _prepare_smollm2(env)
    results = {}
    systems = ("keras_hub", "native")
    for system in systems:
        results[system] = worker_result.run(
            [sys.executable, __file__, "--worker", system, preset, hf_folder]
            + (["--quick"] if args.quick else []),
            env, 1800, system,
        )  # fmt: skip
    def median_ms(system, kind):
        if kind == "lockstep":
            return statistics.median(results[system]["lockstep"])
        return _median_of_runs(results[system]["staggered"], kind)

    rows = []
    for kind, label in (
        ("decode", "staggered, decode"),
        ("joining", "staggered, joining"),
        ("lockstep", "lockstep, decode"),
    ):
        row = {"steps": label}
        for system in systems:
            row[f"{system}_ms"] = median_ms(system, kind)
        row["ratio"] = row["native_ms"] / row["keras_hub_ms"]
        rows.append(row)
    header = f"\n{'steps':22s} {'ours ms':>8s} {'native':>7s} {'speed vs native':>15s}"
    print(header)
    for row in rows:
        print(f"{row['steps']:22s} {row['keras_hub_ms']:8.1f} {row['native_ms']:7.1f} "
              f"{row['ratio']:14.2f}x")  # fmt: skip
    print("\nms a step in each op (staggered, under the profiler):")
    for op in (*MATMUL_OPS, "all ops"):
        cells = "  ".join(
            f"{system} {results[system]['profile_ms_per_step'][op]:6.1f}" for system in systems
        )
        print(f"  {op:32s} {cells}")
    import json

    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "arrivals.json"), "w") as f:
        json.dump(dict(
            concurrency=CONCURRENCY, requests=requests, runs=runs,
            prompt_tokens=PROMPT_TOKENS, new_tokens=NEW_TOKENS, rows=rows,
            profile_ms_per_step={s: r["profile_ms_per_step"] for s, r in results.items()},
            raw=results, date=time.strftime("%Y-%m-%d %H:%M"),
        ), f, indent=1)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["keras_hub_ms"] for r in rows], 0.4, label="vllm-keras-hub")
    ax.bar([i + 0.2 for i in x], [r["native_ms"] for r in rows], 0.4, label="vLLM native")
    ax.set_xticks(list(x), [r["steps"] for r in rows], fontsize=8)
    ax.set_ylabel("median ms per engine step (lower is better)")
    ax.set_title("SmolLM2-135M, 8 requests, compiled, float32, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "arrivals.png"))


if __name__ == "__main__":
    main()

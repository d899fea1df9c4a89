"""The systems the benchmark compares, and one run of one of them.

Each system offers `generate(requests)` for `[(prompt, max_new_tokens)]`,
greedy and never stopping early, and returns the generated token counts.
`run_system` runs one (system, dtype) in this process; the orchestrator
(`run.py`) gives each its own subprocess.
"""

import os
import statistics
import threading
import time
import traceback

from scenarios import SIZES
from scenarios import plan

# name -> label
SYSTEMS = {
    "keras_hub": "vllm-keras-hub (compiled)",
    "keras_hub_eager": "vllm-keras-hub (eager)",
    "native_compiled": "vLLM native (compiled)",
    "native_eager": "vLLM native (eager)",
    "keras_generate": "KerasHub generate() (torch)",
    "hf": "transformers generate()",
}
VLLM_SYSTEMS = ("keras_hub", "keras_hub_eager", "native_compiled", "native_eager")
# The systems that compile at start-up, and whose compile vLLM caches.
COMPILED_SYSTEMS = ("keras_hub", "native_compiled")

MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 2 << 30  # vllm-keras-hub's CPU default, given to native too
# The load-only start: a KV cache small beside the weights.
LOAD_KV_CACHE_BYTES = 64 << 20
SEED = 0


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
        self.workers = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def _sample(self):
        import psutil

        self.peak = max(self.peak, tree_rss(self.root))
        # Each vLLM worker process (one per rank) on its own.
        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            return
        for proc in children:
            try:
                title = (proc.cmdline() or [""])[0]
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            # A worker renames itself (`VLLM::Worker` to `VLLM::Worker_TP0`)
            # once it knows its rank: keyed by pid, named by its last title.
            if title.startswith("VLLM::Worker"):
                _, peak = self.workers.get(proc.pid, ("", 0))
                self.workers[proc.pid] = (title, max(peak, rss))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


class VllmSystem:
    """`KerasHubLLM` or `vllm.LLM` with the benchmark's engine settings."""

    def __init__(
        self,
        system,
        dtype,
        hf_folder,
        preset,
        text,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        kv_cache_bytes=KV_CACHE_BYTES,
        eager=False,
    ):
        import vllm

        kwargs = dict(
            dtype=dtype,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_memory_bytes=kv_cache_bytes,
            seed=SEED,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
        )
        if system in ("keras_hub", "keras_hub_eager"):
            from vllm_keras_hub import KerasHubLLM

            self.llm = KerasHubLLM(
                f"keras_hub:{preset}",
                enforce_eager=eager or system == "keras_hub_eager",
                **kwargs,
            )
        else:
            self.llm = vllm.LLM(
                hf_folder, enforce_eager=eager or system == "native_eager", **kwargs
            )
        self.vllm = vllm
        self.text = text
        self.config_notes = {
            "compilation_mode": getattr(
                self.llm.llm_engine.vllm_config.compilation_config.mode, "name", "?"
            ),
            "enforce_eager": self.llm.llm_engine.vllm_config.model_config.enforce_eager,
            "tensor_parallel_size": tensor_parallel_size,
            "pipeline_parallel_size": pipeline_parallel_size,
        }

    def generate(self, requests):
        # Token-id prompts come from a model whose vocabulary is wider than
        # its tokenizer's: its output ids are not detokenized.
        params = [
            self.vllm.SamplingParams(
                temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=self.text
            )
            for _, n in requests
        ]
        prompts = [
            p if self.text else self.vllm.inputs.TokensPrompt(prompt_token_ids=p)
            for p, _ in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
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

    def __init__(self, dtype, preset, text):

        from vllm_keras_hub.export.sampling import causal_lm_class

        self.text = text
        self.model = causal_lm_class(preset).from_preset(
            preset, dtype=dtype, **({} if text else {"preprocessor": None})
        )
        self.model.compile(sampler="greedy")
        if text:
            self.tokenizer = self.model.preprocessor.tokenizer
            self.add_start = bool(self.model.preprocessor.add_start_token)
        self.config_notes = {"keras_backend": __import__("keras").backend.backend()}

    def generate(self, requests):
        import numpy as np

        if self.text:
            prompt_lengths = [
                len(self.tokenizer(p)) + int(self.add_start) for p, _ in requests
            ]
        else:
            prompt_lengths = [len(p) for p, _ in requests]
        # One batch, right-padded to `max_length`; decoding starts at the
        # shortest prompt and every row runs to `max_length` (no stop ids), so
        # each row gets at least its own budget.
        max_length = max(length + n for length, (_, n) in zip(prompt_lengths, requests))
        if self.text:
            inputs = [p for p, _ in requests]
            self.model.generate(inputs, max_length=max_length, stop_token_ids=None)
        else:
            token_ids = np.zeros((len(requests), max_length), "int32")
            padding_mask = np.zeros((len(requests), max_length), bool)
            for row, (ids, _) in enumerate(requests):
                token_ids[row, : len(ids)] = ids
                padding_mask[row, : len(ids)] = True
            self.model.generate(
                {"token_ids": token_ids, "padding_mask": padding_mask},
                stop_token_ids=None,
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


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def run_system(
    system,
    dtype,
    size,
    hf_folder,
    preset,
    text,
    startup_only=False,
    tensor_parallel_size=1,
    pipeline_parallel_size=1,
    load_only=False,
):
    """One (system, dtype) in this process: start-up, then every scenario.

    Args:
        system: A key of `SYSTEMS`.
        dtype: `"float32"` or `"bfloat16"`.
        size: A key of `scenarios.SIZES`.
        hf_folder: The model's Hugging Face folder.
        preset: The model's KerasHub preset.
        text: Whether the model's prompts are text (else token ids).
        startup_only: Only start (and compile) the system.
        tensor_parallel_size: vLLM's, for the vLLM systems.
        pipeline_parallel_size: vLLM's, for the vLLM systems.
        load_only: Only start a vLLM system, eager and with a 64 MiB KV
            cache, so each worker's peak RSS is what loading the weights
            took (`load_worker_peak_rss_mb`).
    """
    import torch

    scenarios = plan(size, text, None if system in VLLM_SYSTEMS else 1)
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
                engine = VllmSystem(
                    system, dtype, hf_folder, preset, text,
                    tensor_parallel_size, pipeline_parallel_size,
                    **(dict(kv_cache_bytes=LOAD_KV_CACHE_BYTES, eager=True)
                       if load_only else {}),
                )  # fmt: skip
            elif system == "keras_generate":
                engine = KerasGenerateSystem(dtype, preset, text)
            else:
                engine = HfSystem(dtype, hf_folder)
            result["startup_s"] = time.perf_counter() - start
        except Exception as e:  # recorded, and the run goes on
            result["error"] = f"start-up failed: {type(e).__name__}: {e}"
            result["traceback"] = traceback.format_exc()[-4000:]
            result["peak_rss_mb"] = None
            return result
        result["config"] = engine.config_notes
        if load_only:
            engine.close()
            result["load_worker_peak_rss_mb"] = {
                title: peak / 2**20 for title, peak in sorted(rss.workers.values())
            }
            return result
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
            runs = []
            for requests in scenarios[f"c{concurrency}"]:
                seconds, counts = timed(engine.generate, requests)
                wanted = [m for _, m in requests]
                assert counts == wanted, (counts, wanted)
                runs.append(
                    {
                        "generated_tokens": sum(wanted),
                        "computed_tokens": getattr(engine, "last_computed", sum(wanted)),
                        "prompt_tokens": sum(engine.last_prompt_tokens),
                        "seconds": seconds,
                    }
                )
            rates = [run["generated_tokens"] / run["seconds"] for run in runs]
            result["throughput"][str(concurrency)] = statistics.median(rates)
            result["concurrent"][str(concurrency)] = {
                "requests": concurrency,
                "runs": runs,
                "tokens_per_s": rates,
            }
        engine.close() if hasattr(engine, "close") else None
    result["peak_rss_mb"] = rss.peak / 2**20
    if rss.workers:
        result["worker_peak_rss_mb"] = {
            title: peak / 2**20 for title, peak in sorted(rss.workers.values())
        }
    return result

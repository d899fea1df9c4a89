"""Adapters per request: vllm-keras-hub against vLLM native, same weights.

    .venv/bin/python bench/lora.py            # about 25 min (cold compiles)
    .venv/bin/python bench/lora.py --quick    # smoke run

SmolLM2-135M-Instruct: the KerasHub preset for vllm-keras-hub, its Hugging
Face export for vLLM's native Llama. Four KerasHub adapters (KerasHub's
default query/value targets, rank 8, random B) are written with
`save_lora_weights`. vllm-keras-hub serves the `.lora.h5` files; native
serves the same A and B as PEFT folders of `q_proj`/`v_proj`, made from the
same standard-form tensors (`lora/adapters.py`). Each system runs in its own
subprocess, one after another, in float32 with one thread, and generates the
same 16 prompts (16 tokens each) with 0 (base requests on a LoRA engine), 1 and 4 adapters
active, and on an engine without LoRA (default mode: compiled). vLLM turns
compilation off on the CPU whenever LoRA is enabled, for both systems.
Writes `bench/results/lora.json` and `bench/results/lora.png`.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import worker_result  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
RANK = 8
ADAPTERS = 4
MAX_LORA_RANK = 128  # SmolLM2's query: 9 heads x rank 8 = 72.
CASES = ("no LoRA (compiled)", "base on LoRA engine", "1 adapter", "4 adapters")


def make_adapters(preset, root):
    """Four KerasHub adapter files, and the same adapters as native PEFT."""
    import keras_hub
    import numpy as np
    from safetensors.torch import save_file

    from vllm_keras_hub.lora import adapters as lora_adapters
    from vllm_keras_hub.lora import merged as lora

    backbone = keras_hub.models.Backbone.from_preset(preset)
    # The layer layout, as the served conversion sees it (no LoRA enabled).
    layout = lora_adapters._meta_backbone(preset)
    hf_names = {}
    for j, block in enumerate(layout.transformer_layers):
        attention = block._self_attention_layer
        hf_names[id(attention._query_dense)] = f"model.layers.{j}.self_attn.q_proj"
        hf_names[id(attention._value_dense)] = f"model.layers.{j}.self_attn.v_proj"
    weighted = lora.weighted_layers(layout)
    backbone.enable_lora(RANK)
    made = []
    for n in range(ADAPTERS):
        for layer in backbone._flatten_layers():
            if getattr(layer, "lora_enabled", False):
                b = np.random.default_rng(n).normal(0, 0.02, layer.lora_kernel_b.shape)
                layer.lora_kernel_b.assign(b)
                a = np.random.default_rng(100 + n).normal(0, 0.02, layer.lora_kernel_a.shape)
                layer.lora_kernel_a.assign(a)
        keras_file = os.path.join(root, f"adapter{n}.lora.h5")
        backbone.save_lora_weights(keras_file)
        converted = lora_adapters.convert(layout, keras_file)
        native = os.path.join(root, f"native{n}")
        os.makedirs(native, exist_ok=True)
        tensors, ranks = {}, {}
        for module, rank in converted.ranks.items():
            name = hf_names[id(weighted[int(module.rsplit(".", 1)[1])])]
            for kind in ("lora_A", "lora_B"):
                tensor = converted.tensors[f"base_model.model.{module}.{kind}.weight"]
                tensors[f"base_model.model.{name}.{kind}.weight"] = tensor
            ranks[name] = rank
        save_file(tensors, os.path.join(native, "adapter_model.safetensors"))
        patterns = {name.replace(".", r"\."): r for name, r in ranks.items()}
        top = max(ranks.values())
        with open(os.path.join(native, "adapter_config.json"), "w") as f:
            json.dump(
                dict(peft_type="LORA", r=top, lora_alpha=top, bias="none",
                     target_modules=["q_proj", "v_proj"], rank_pattern=patterns,
                     alpha_pattern=patterns),
                f,
            )  # fmt: skip
        made.append((keras_file, native))
    return made


def worker(system, case, preset, hf_folder, adapters, prompts, max_tokens):
    """One system, one case: `(tok/s, first row's token ids)`."""
    import vllm
    from vllm.lora.request import LoRARequest

    lora = case != CASES[0]
    kwargs = dict(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=2 << 30, seed=0
    )
    if lora:
        kwargs.update(enable_lora=True, max_loras=ADAPTERS, max_lora_rank=MAX_LORA_RANK)
    if system == "keras_hub":
        from vllm_keras_hub import KerasHubLLM

        llm = KerasHubLLM(f"keras_hub:{preset}", **kwargs)
    else:
        llm = vllm.LLM(hf_folder, **kwargs)
    active = {CASES[2]: 1, CASES[3]: ADAPTERS}.get(case, 0)
    column = 0 if system == "keras_hub" else 1
    requests = [
        LoRARequest(f"a{n}", n + 1, adapters[n][column]) if active else None
        for n in (i % max(active, 1) for i in range(len(prompts)))
    ]
    params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], params, lora_request=requests[:2], use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=requests, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    mode = llm.llm_engine.vllm_config.compilation_config.mode.name
    return dict(
        tok_s=tokens / elapsed,
        compilation_mode=mode,
        tokens=[list(o.outputs[0].token_ids) for o in outputs],
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", nargs=2)
    args = parser.parse_args()
    from vllm_keras_hub import backend

    backend.default_to_torch()
    size = dict(prompts=4, max_tokens=4) if args.quick else dict(prompts=16, max_tokens=16)
    from vllm_keras_hub.cache import default_cache_dir

    root = os.path.join(default_cache_dir(), "bench", "lora-adapters")
    setup_path = os.path.join(root, "setup.json")
    if args.worker:
        with open(setup_path) as f:
            setup = json.load(f)
        result = worker(*args.worker, **setup)
        worker_result.emit(result)
        return
    from bench.models import _prepare_smollm2
    from bench.run import worker_env

    env = worker_env(1)
    preset, hf_folder, _ = _prepare_smollm2(env)
    os.makedirs(root, exist_ok=True)
    adapters = make_adapters(preset, root)
    topics = [f"Tell me about topic number {i} in one sentence." for i in range(size["prompts"])]
    with open(setup_path, "w") as f:
        json.dump(dict(preset=preset, hf_folder=hf_folder, adapters=adapters,
                       prompts=topics, max_tokens=size["max_tokens"]), f)  # fmt: skip
    results = {}
    for case in CASES:
        for system in ("keras_hub", "native"):
            results[(system, case)] = worker_result.run(
                [sys.executable, __file__, "--worker", system, case],
                env, 1200, f"{system} / {case}",
            )
            print(f"{case:24s} {system:10s} {results[(system, case)]['tok_s']:7.1f} tok/s", flush=True)
    rows = []
    for case in CASES:
        ours, native = results[("keras_hub", case)], results[("native", case)]
        same = sum(a == b for a, b in zip(ours["tokens"], native["tokens"]))
        rows.append(dict(
            case=case, keras_hub_tok_s=ours["tok_s"], native_tok_s=native["tok_s"],
            ratio=ours["tok_s"] / native["tok_s"], same_tokens_rows=same,
            rows=len(ours["tokens"]), compilation_mode=ours["compilation_mode"],
        ))  # fmt: skip
    print(f"\n{'case':24s} {'keras_hub':>10s} {'native':>8s} {'ratio':>6s}  same rows")
    for r in rows:
        print(f"{r['case']:24s} {r['keras_hub_tok_s']:10.1f} {r['native_tok_s']:8.1f} "
              f"{r['ratio']:5.2f}x  {r['same_tokens_rows']}/{r['rows']}")  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "lora.json"), "w") as f:
        json.dump(dict(size=size, rank=RANK, max_lora_rank=MAX_LORA_RANK, rows=rows,
                       date=time.strftime("%Y-%m-%d %H:%M")), f, indent=1)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["keras_hub_tok_s"] for r in rows], 0.4, label="vllm-keras-hub")
    ax.bar([i + 0.2 for i in x], [r["native_tok_s"] for r in rows], 0.4, label="vLLM native")
    ax.set_xticks(list(x), [r["case"] for r in rows], fontsize=8)
    ax.set_ylabel(f"tok/s, {size['prompts']} requests")
    ax.set_title("SmolLM2-135M, float32, LoRA rank 8 on query/value")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "lora.png"))


if __name__ == "__main__":
    main()

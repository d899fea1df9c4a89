"""Tables, targets and plots of a benchmark run, per model."""

from systems import SYSTEMS

DTYPES = ("float32", "bfloat16")


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


# The targets for vllm-keras-hub in its default mode, per model (issue #4
# for SmolLM2, issue #14 for the MoE models): (metric, against, the
# baseline's metric, ratio bound, higher is better).
_MOE_TARGETS = [
    ("tput_32", "native", "tput_32", 0.9, True),
    ("decode_ms_per_token", "native", "decode_ms_per_token", 1.15, False),
    ("peak_rss_mb", "native", "peak_rss_mb", 1.1, False),
]
TARGETS = {"qwen3_moe": _MOE_TARGETS, "mixtral": _MOE_TARGETS}
# Peak RSS here is the whole tree: front end, engine core and both ranks.
TARGETS["llama_tp2"] = _MOE_TARGETS
TARGETS["smollm2_pp2"] = _MOE_TARGETS
# Issue #19: Qwen3.5 at least 0.9x native.
TARGETS["qwen3_5"] = _MOE_TARGETS
TARGETS["smollm2"] = [
    ("tput_32", "native", "tput_32", 0.9, True),
    ("decode_ms_per_token", "native", "decode_ms_per_token", 1.15, False),
    ("startup_s", "native", "startup_s", 1.2, False),
    # Both restarts with vLLM's saved-compile loader fixed (bench/README.md).
    ("startup_s", "native", "startup_load_fixed_s", 1.2, False),
    # Issue #29: a first compile at most 1.1x native's.
    ("startup_cold_s", "native", "startup_cold_s", 1.1, False),
    ("peak_rss_mb", "native", "peak_rss_mb", 1.1, False),
    ("tput_32", "keras_generate", "tput_32", 8.0, True),
]


def check_targets(model, results):
    """Each target's measured ratio per dtype, and whether it is met."""
    base = baselines(results)
    found = {(r.get("system"), r.get("dtype")): r for r in results if "error" not in r}
    checks = []
    for dtype in DTYPES:
        ours = found.get(("keras_hub", dtype))
        for key, against, ref_key, bound, higher in TARGETS.get(model, []):
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


def format_ranks(results):
    """Each rank's peak RSS, serving and while loading, for parallel runs."""
    rows = [r for r in results if r.get("worker_peak_rss_mb")]
    if not rows:
        return ""
    lines = ["| system | dtype | peak RSS per rank MB, serving | peak RSS per rank MB, "
             "loading (64 MiB KV cache) |", "| --- | --- | --- | --- |"]

    def ranks(peaks):
        return ", ".join(f"{v:.0f}" for v in (peaks or {}).values()) or "-"

    for r in rows:
        lines.append(f"| {r['label']} | {r['dtype']} | {ranks(r['worker_peak_rss_mb'])} | "
                     f"{ranks(r.get('load_worker_peak_rss_mb'))} |")
    return "\n".join(lines)


def format_serve_table(serve):
    if not serve:
        return ""
    lines = ["| server | dtype | concurrency | output tok/s (median) | runs | vs native | "
             "mean TTFT ms | mean TPOT ms | start-up s | peak RSS MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    native = next((r for r in serve if r.get("system") == "native" and "error" not in r), None)
    for r in serve:
        if "error" in r:
            lines.append(f"| {r.get('label', r.get('system'))} | {r.get('dtype')} | | failed: "
                         f"{r['error'].splitlines()[0][:80]} | | | | | | |")
            continue
        for concurrency, c in r["concurrency"].items():
            runs = ", ".join(f"{x['output_throughput']:.1f}" for x in c["runs"])
            ratio = ""
            if native is not None and concurrency in native.get("concurrency", {}):
                base = native["concurrency"][concurrency]["output_throughput"]
                ratio = f"{c['output_throughput'] / base:.2f}x"
            lines.append(
                f"| {r['label']} | {r['dtype']} | {concurrency} | {c['output_throughput']:.1f} | "
                f"{runs} | {ratio} | {c['mean_ttft_ms']:.1f} | {c['mean_tpot_ms']:.1f} | "
                f"{r['startup_s']:.1f} | {r['peak_rss_mb']:.0f} |"
            )
    r = next((r for r in serve if "error" not in r), None)
    if r:
        lines.append("")
        lines.append(
            f"`vllm bench serve` (vllm.benchmarks.serve.main): random dataset, "
            f"{r['input_len']} -> {r['output_len']} tokens (ignore_eos), greedy; at each "
            f"max concurrency C, {r['repeats']} runs of {r['prompts_per_slot']}C prompts, each on new prompts; "
            "TTFT and TPOT are the median run's."
        )
    return "\n".join(lines)


def plot(results, meta, label, path):
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
        f"{label}, {meta['machine']}, OMP_NUM_THREADS={meta['threads']} "
        f"({meta['size']} run, {meta['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

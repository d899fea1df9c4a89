"""A tied output head's matmul per row count: one table against a packed copy.

    .venv/bin/python bench/head.py            # about 3 min
    .venv/bin/python bench/head.py --quick    # smoke run

A tied head's table is also the input lookup, so it can stay one tensor
only if the projection multiplies by it unpacked. This times, in one
process, one thread, float32, `logits = rows @ table.T` for SmolLM2's
(49152 x 576) and Gemma3-1B's (262144 x 1152) table shapes at 1 to 64
rows, three ways:

- `packed`: vLLM's CPU GEMM dispatch over a copy it packs, as vLLM's own
  CPU models hold a tied head and as vllm-keras-hub does since 2026-12-06
  (`layers/linear/tied_output.py`);
- `onednn_unpacked`: oneDNN over the one table (vllm-keras-hub before);
- `aten`: torch's `F.linear` over the one table (MKL here).

Median of 15 calls each, random weights. Writes `bench/results/head.json`
and `head.png`.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "bench", "results")
SHAPES = {"smollm2": (49152, 576), "gemma3_1b": (262144, 1152)}
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


def _median_ms(matmul, rows, calls):
    for _ in range(2):
        matmul(rows)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        matmul(rows)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def kernels(table):
    """`{name: matmul(rows)}` over `table`, `(vocabulary, hidden)`."""
    import torch

    from vllm_keras_hub.layers.linear import linear

    return {
        "packed": linear._pack(table.t()),
        "onednn_unpacked": lambda rows: torch.ops.mkldnn._linear_pointwise(
            rows, table, None, "none", [], ""
        ),
        "aten": lambda rows: torch.nn.functional.linear(rows, table),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from vllm_keras_hub import backend

    backend.default_to_torch()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    calls = 3 if args.quick else 15
    rows_tried = ROWS[:3] if args.quick else ROWS
    results = {}
    for shape_name, (vocabulary, hidden) in SHAPES.items():
        table = torch.randn(vocabulary, hidden) * 0.02
        matmuls = kernels(table)
        probe = torch.randn(5, hidden)
        expected = matmuls["aten"](probe)
        for name, matmul in matmuls.items():
            torch.testing.assert_close(matmul(probe), expected, rtol=1e-4, atol=1e-4)
        results[shape_name] = {name: {} for name in matmuls}
        print(f"\n{shape_name} ({vocabulary} x {hidden}), ms per call, one thread")
        print(f"{'rows':>5s} " + " ".join(f"{name:>16s}" for name in matmuls)
              + "  unpacked / packed")  # fmt: skip
        for count in rows_tried:
            rows = torch.randn(count, hidden)
            for name, matmul in matmuls.items():
                results[shape_name][name][count] = _median_ms(matmul, rows, calls)
            cells = [results[shape_name][name][count] for name in matmuls]
            print(f"{count:5d} " + " ".join(f"{ms:16.2f}" for ms in cells)
                  + f"  {cells[1] / cells[0]:.2f}x")  # fmt: skip
        del matmuls, table
    import json

    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "head.json"), "w") as f:
        json.dump(dict(shapes=SHAPES, calls=calls, results=results,
                       date=time.strftime("%Y-%m-%d %H:%M")), f, indent=1)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(10, 4))
    for ax, (shape_name, by_kernel) in zip(axes, results.items()):
        for name, times in by_kernel.items():
            ax.plot(list(times), list(times.values()), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows (sequences in the step)")
        ax.set_ylabel("ms per head matmul (lower is better)")
        ax.set_title(f"{shape_name} {SHAPES[shape_name]}, float32, 1 thread", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "head.png"))


if __name__ == "__main__":
    main()

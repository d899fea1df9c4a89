"""The supported-family matrix, made only from what recorded runs measured.

The parity tests fill in this run's cells as they pass or fail
(`model_test.py` each tiny preset's parity and the attention features its
served model used, `parallel_test.py` the parallel columns, `vision*_test.py`
images, audio and video); refusal tests record the refusals they saw, and the
chat tests what each family's format did. `conftest.py` writes the run, with
its commit and date, to `build/test-reports/support_matrix.json`;
`scripts/update-reports` merges it into `reports/support-matrix.json`, where
each cell keeps the run that last measured it, and renders that into
docs/supported-families.md (`tests/docs_test.py` checks the page is that
rendering). A run of uncommitted changes is not merged.
"""

import json
import subprocess
import time

from vllm_keras_hub import families

RESULTS = {}
CHAT = {}
REFUSED = {}
COLUMNS = (
    "batched", "chunked", "prefix_cache", "compiled", "tp2", "pp2", "window", "soft_cap",
    "sinks", "moe", "images", "audio", "video",
)
HEADINGS = (
    "greedy parity, batched", "greedy parity, chunked prefill",
    "greedy parity, prefix-cache hit", "greedy parity, compiled",
    "greedy parity, 2 ranks (tensor parallel)", "greedy parity, 2 stages (pipeline parallel)",
    "sliding window", "soft cap", "sinks", "MoE", "images, greedy parity",
    "audio, greedy parity", "video, greedy parity",
)


def record(preset_name, backbone, **values):
    """Records results for one tiny preset, e.g. `batched="pass"`."""
    RESULTS.setdefault(preset_name, {"backbone": backbone}).update(values)


def record_chat(family_name, value, served=False):
    """Records what a chat test saw of a family's format: "renders" (its
    template renders as the official one), or with `served`, the parsers a
    server run parsed a call and thinking with, e.g. "tools: `hermes`"."""
    cells = CHAT.setdefault(family_name, {}).setdefault("served" if served else "format", [])
    if value not in cells:
        cells.append(value)


def record_refusal(backbone, column):
    """Records that a test saw `backbone` refused at start-up for `column`
    (`"tp2"` or `"pp2"`)."""
    REFUSED.setdefault(backbone, set()).add(column)


def commit_of(root):
    """The commit checked out at `root`, or None if the checkout has changes
    besides reports."""
    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()

    changed = git("status", "--porcelain", "--", ".", ":!reports", ":!build")
    return None if changed else (git("rev-parse", "--short", "HEAD") or None)


def this_run(root):
    """This run's cells, with the commit it ran (`commit_of`) and its date."""
    return {
        "commit": commit_of(root),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": RESULTS,
        "chat": CHAT,
        "refused": {backbone: sorted(columns) for backbone, columns in REFUSED.items()},
    }


def merge(recorded, run):
    """`recorded` (the committed matrix) with `run`'s cells in their places.

    Raises:
        ValueError: for a run of uncommitted changes.
    """
    if not run["commit"]:
        raise ValueError("the run had uncommitted changes: commit, then run again")
    runs = dict(recorded.get("runs", {}))
    name = next(
        (key for key, value in runs.items() if value == {"commit": run["commit"], "date": run["date"]}),
        f"r{max((int(key[1:]) for key in runs), default=0) + 1}",
    )
    runs[name] = {"commit": run["commit"], "date": run["date"]}
    rows = {key: {"backbone": value["backbone"], "cells": dict(value["cells"])}
            for key, value in recorded.get("rows", {}).items()}
    for row, values in run["rows"].items():
        entry = rows.setdefault(row, {"backbone": values["backbone"], "cells": {}})
        for column, value in values.items():
            if column != "backbone":
                entry["cells"][column] = [value, name]
    # Each kind of a chat cell keeps the run that saw it, so that a run of
    # the template tests alone keeps what a server run parsed.
    chat = {key: {kind: list(cell) for kind, cell in value.items()}
            for key, value in recorded.get("chat", {}).items()}
    for family_name, kinds in run["chat"].items():
        for kind, values in kinds.items():
            chat.setdefault(family_name, {})[kind] = ["; ".join(sorted(values)), name]
    refused = {key: dict(value) for key, value in recorded.get("refused", {}).items()}
    # A layout a run served is no longer refused, and a run's refusal stands.
    for values in run["rows"].values():
        columns = refused.get(values["backbone"], {})
        for column in [column for column in columns if column in values]:
            del columns[column]
    for backbone, columns in run["refused"].items():
        for column in columns:
            refused.setdefault(backbone, {})[column] = name
    refused = {key: value for key, value in refused.items() if value}
    used = {run_name for value in rows.values() for _, run_name in value["cells"].values()}
    used |= {run_name for kinds in chat.values() for _, run_name in kinds.values()}
    used |= {run_name for value in refused.values() for run_name in value.values()}
    return {
        "runs": {key: value for key, value in sorted(runs.items()) if key in used},
        "rows": dict(sorted(rows.items())),
        "chat": dict(sorted(chat.items())),
        "refused": dict(sorted(refused.items())),
    }


def _chat_cell(kinds):
    parts = [_cell(*kinds["format"])] if "format" in kinds else []
    if "served" in kinds:
        parts.append("served: " + _cell(*kinds["served"]))
    return "; ".join(parts)


def _cell(value, run_name):
    if value is True:
        value = "yes"
    if value in (False, None, ""):
        return ""
    return f"{value} ({run_name})"


def render(recorded):
    """The committed matrix as Markdown, each cell tagged with its run."""
    lines = [
        "| family | test preset | route | " + " | ".join(HEADINGS) + " | chat format |",
        "| --- " * (len(HEADINGS) + 4) + "|",
    ]
    tested = set()
    for name, row in recorded["rows"].items():
        family = families.family_for_backbone(row["backbone"])
        tested.add(family.name)
        route = {"keras_hub": "keras-hub's", "vllm_keras_hub": "ours"}[family.route]
        refused = recorded["refused"].get(row["backbone"], {})
        cells = []
        for column in COLUMNS:
            if column in refused:
                cells.append(_cell("refused", refused[column]))
            else:
                cells.append(_cell(*row["cells"].get(column, (None, None))))
        chat = recorded["chat"].get(family.name)
        cells.append(_chat_cell(chat) if chat else "")
        lines.append("| " + " | ".join([family.display_name, name, route, *cells]) + " |")
    for family in families.FAMILIES:
        if family.route is None:
            lines.append(
                f"| {family.display_name} | | refused: {family.unsupported_reason} "
                + "| " * (len(HEADINGS) + 1) + "|"
            )
        # The causal LMs' matrix: the other tasks have their own pages.
        elif family.name not in tested and not (family.embedder_only or family.encoder_decoder):
            lines.append(
                f"| {family.display_name} | | in no recorded run "
                + "| " * (len(HEADINGS) + 1) + "|"
            )
    reasons = _refusal_reasons(recorded["refused"])
    if reasons:
        lines += ["", "Refused, as the start-up error says:", "", *reasons]
    lines += ["", "Runs:", ""]
    lines += [
        f"- {name}: {run['commit']}, {run['date']}" for name, run in recorded["runs"].items()
    ]
    lines += ["", *_task_rows()]
    return "\n".join(lines) + "\n"


def _task_rows():
    """The other tasks served, from the family table: their own pages name
    each claim's test and tier."""
    from vllm_keras_hub.tasks.text_classifier.spec import HEADS
    from vllm_keras_hub.testing.classifiers import TINY_CLASSIFIERS

    classifiers = {head.backbone: name for name, head in HEADS.items()}
    # Scoring pairs is proven where a tiny cross-encoder is tested.
    pairs = {task for name, (task, _, _) in TINY_CLASSIFIERS.items() if "cross_encoder" in name}
    lines = [
        "The other tasks, each proven on its own page (not a recorded run's cells):",
        "",
        "| family | task | served on | page |",
        "| --- | --- | --- | --- |",
    ]
    for family in families.FAMILIES:
        tasks = [
            (family.embedder, "`/v1/embeddings`", "embeddings.md"),
            (classifiers.get(family.backbone), "`/classify`" + (
                "; one output: `/v1/score`, `/v1/rerank`"
                if classifiers.get(family.backbone) in pairs else ""), "classifiers.md"),
            (family.seq2seq, "`/v1/completions`", "seq2seq.md"),
            (family.audio_to_text, "`/v1/audio/transcriptions`", "speech-to-text.md"),
        ]  # fmt: skip
        for task, endpoint, page in tasks:
            if task and family.route is not None:
                lines.append(f"| {family.display_name} | `{task}` | {endpoint} | [{page}]({page}) |")
    return lines


def _refusal_reasons(refused):
    from vllm_keras_hub.parallel_settings import TENSOR_REFUSAL

    lines = []
    for backbone, columns in refused.items():
        family = families.family_for_backbone(backbone)
        reasons = {
            "tp2": ("2 ranks", "" if family.tensor_parallel else TENSOR_REFUSAL),
            "pp2": ("2 stages", family.pipeline_refusal),
        }
        for column in sorted(columns):
            layout, reason = reasons[column]
            lines.append(f"- {family.display_name}, {layout}: {reason or 'refused'}.")
    return lines


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"runs": {}, "rows": {}, "chat": {}, "refused": {}}


RECORDED = "reports/support-matrix.json"
PAGE = "docs/supported-families.md"
START, END = "<!-- support-matrix:start -->", "<!-- support-matrix:end -->"


def page_block(recorded):
    """The generated block of `PAGE`, markers included."""
    return f"{START}\n<!-- Generated by scripts/update-reports from {RECORDED}. -->\n{render(recorded)}{END}"


def update(run_path, root="."):
    """Merges the run at `run_path` into `RECORDED` and renders `PAGE`."""
    import os
    import re

    with open(run_path) as f:
        run = json.load(f)
    recorded = merge(load(os.path.join(root, RECORDED)), run)
    with open(os.path.join(root, RECORDED), "w") as f:
        json.dump(recorded, f, indent=1)
        f.write("\n")
    page = os.path.join(root, PAGE)
    with open(page) as f:
        text = f.read()
    pattern = re.escape(START) + ".*?" + re.escape(END)
    text, count = re.subn(pattern, lambda _: page_block(recorded), text, flags=re.S)
    if count != 1:
        raise ValueError(f"{PAGE} has no support-matrix markers")
    with open(page, "w") as f:
        f.write(text)


if __name__ == "__main__":
    import sys

    update(sys.argv[1])
    print(f"{RECORDED} and {PAGE} updated")

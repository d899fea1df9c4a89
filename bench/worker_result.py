"""A benchmark worker's one result, handed from its subprocess as a JSON line.

`bench/lora.py`, `speculative.py` and `memory.py` run each system in its own
`python <script> --worker ...` process, so its start-up and memory are its
own; the worker prints `emit(result)` and the parent reads it with `run`.
"""

import json
import subprocess
import sys

_PREFIX = "RESULT "


def emit(result):
    """Prints `result` (JSON-serialisable) for the parent's `run`."""
    print(_PREFIX + json.dumps(result), flush=True)


def run(argv, env, timeout_s, label):
    """Runs a worker and returns its result; exits naming `label` if none.

    Args:
        argv: The worker's command line.
        env: Its environment.
        timeout_s: How long it may take.
        label: What it runs, for the message if it fails.
    """
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in out.stdout.splitlines() if line.startswith(_PREFIX)]
    if out.returncode or not lines:
        sys.exit(f"{label} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(_PREFIX) :])

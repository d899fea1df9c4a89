"""A real `vllm-keras-hub serve` process on a free loopback port, for tests."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# A first compiled start of SmolLM2 takes ~3 minutes on 2 idle cores.
STARTUP_TIMEOUT_S = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(command, port, timeout_s=STARTUP_TIMEOUT_S, env=None):
    """Runs `command` (a server on `port`) until the block exits.

    Yields once `/health` answers 200. The server's output goes to a log file
    whose tail is shown if it dies or does not come up in time.

    Args:
        command: The argv to run.
        port: The loopback port it listens on.
        timeout_s: How long start-up may take.
        env: The server's environment; this process's by default.

    Yields:
        `(base_url, process)`.
    """
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy in {timeout_s} s:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        yield base_url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
        os.unlink(log.name)


def _tail(log, lines=60):
    log.flush()
    with open(log.name) as f:
        return "".join(f.readlines()[-lines:])


def serve_command(*args):
    """`vllm-keras-hub serve ...` run by this interpreter."""
    return [sys.executable, "-m", "vllm_keras_hub.cli", "serve", *args]

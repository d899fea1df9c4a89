"""The suite's own set-up in `conftest.py`."""

import logging.config

# At collection, as the modules that import Keras do: absl's handler is made
# while pytest's capture file is `sys.stderr`.
from absl import logging as absl_logging


def test_clearing_logging_handlers_in_a_capsys_test_keeps_capture_open(capsys):
    """vLLM's `dictConfig` closes every handler when an engine starts in
    this process; absl's must not take pytest's capture file with it."""
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    assert not absl_logging.get_absl_handler().python_handler.stream.closed
    print("still captured")
    assert capsys.readouterr().out == "still captured\n"

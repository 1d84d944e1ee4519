"""kb's compute log manager: Dagster's local one, without its `tail -F` helpers.

Dagster's LocalComputeLogManager copies each step's stdout and stderr into
files (the UI shows them), and mirrors the files back to the terminal with
two `tail -F` processes per step and one watcher process each. Hard-won
fact (issue 55): these helpers outlive a step that kb stops. A run worker
that was started with SIGINT ignored (any start in the background: a
service, `nohup`, a CI job) maps SIGTERM to the same "ignore"
(Dagster's setup_interrupt_handlers), and `tail` inherits it. Dagster's
clean-up and its watcher stop a helper with SIGTERM only, so each helper
lives on. After one run of the test suite, 8 were left.

This class keeps the same files, in the same place, so the UI shows the
same logs. It starts no process: a thread of the step's own process copies
the output into the file and to the terminal (a tee through a pipe). The
thread ends with its step, and with its process in every case.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import dagster as dg

from kb_assets.dagster_internals import CapturedLogContext, LocalComputeLogManager

# The file extensions of Dagster's local compute logs (IO_TYPE_EXTENSION).
STDOUT_EXTENSION, STDERR_EXTENSION = "out", "err"
# How long the end of a step waits for the tee to copy the last output. A
# child process that still holds the pipe (it outlived its step) keeps the
# thread; the step does not wait for it.
DRAIN_S = 2.0
CHUNK = 65536


@contextmanager
def tee_fd(stream, path: str) -> Iterator[None]:
    """Send what the process writes to `stream`'s file descriptor (children
    included) into the file `path` and to where the descriptor went before."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        # A test runner's stream has no descriptor: nothing to copy.
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stream.flush()
    saved = os.dup(fd)
    read_end, write_end = os.pipe()
    log_file = open(path, "ab", buffering=0)  # noqa: SIM115 - the thread closes it

    def copy() -> None:
        try:
            while chunk := os.read(read_end, CHUNK):
                log_file.write(chunk)
                try:
                    os.write(saved, chunk)
                except OSError:
                    pass  # the terminal is gone: the file still gets the output
        finally:
            os.close(read_end)
            log_file.close()

    thread = threading.Thread(target=copy, name=f"kb-compute-log-{fd}", daemon=True)
    thread.start()
    os.dup2(write_end, fd)
    os.close(write_end)
    try:
        yield
    finally:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, fd)  # the last writer of the pipe in this process closes: the thread sees its end
        thread.join(DRAIN_S)
        if not thread.is_alive():
            os.close(saved)  # else the thread still copies into it: the descriptor goes with the process


class KbComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute logs (the same files), with no helper process."""

    @classmethod
    def config_type(cls):
        # base_dir may be left out: the `storage` folder of DAGSTER_HOME, as
        # Dagster's default compute log manager uses.
        return {"base_dir": dg.Field(dg.StringSource, is_required=False),
                "polling_timeout": dg.Field(dg.Float, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> KbComputeLogManager:
        config = dict(config_value)
        if not config.get("base_dir"):
            config["base_dir"] = os.path.join(os.environ["DAGSTER_HOME"], "storage")
        return cls(inst_data=inst_data, **config)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator:
        with ExitStack() as stack:
            stack.enter_context(tee_fd(sys.stdout, self.get_captured_local_path(log_key, STDOUT_EXTENSION)))
            stack.enter_context(tee_fd(sys.stderr, self.get_captured_local_path(log_key, STDERR_EXTENSION)))
            yield CapturedLogContext(log_key)
        # The mark that the capture is complete, as Dagster leaves it.
        with open(self.complete_artifact_path(log_key), "a"):
            pass

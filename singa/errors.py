"""The user-facing error types: one line that names the file, line, field or param."""
import argparse
import logging
import sys


class SingaError(Exception):
    """A user mistake or a bad input; the CLI prints the message alone and exits with `exit_code`."""
    exit_code = 2


class ConfigError(SingaError):
    """A job.conf / singa.conf that cannot be used (message: `<file>:<line>: <what>`)."""


class DataError(SingaError):
    """A data store, IDX file or record that cannot be read."""


class CheckpointError(SingaError):
    """A checkpoint file that is missing, torn, corrupt or does not fit the net."""


class ClusterError(SingaError):
    """ZooKeeper or a peer process that cannot be reached (message names host and port)."""
    exit_code = 1


class ExecutorError(SingaError):
    """A worker or server thread failed on something other than a user mistake (a bug)."""
    exit_code = 1


class NonFiniteError(SingaError):
    """Training produced nan or inf (a loss or a param): the message names the step and the layer
    or param; no snapshot holds the bad values."""


def executor_failure(e, who):
    """(kind, text) a worker or server thread reports to its stub for exception `e`: a
    SingaError's class name and line (a user's mistake: no traceback), else "RuntimeError" and
    "<type>: <message>", after logging the traceback as "<who> failed" (a bug)."""
    if isinstance(e, SingaError):
        return type(e).__name__, str(e)
    logging.getLogger("singa").exception("%s failed", who)
    return "RuntimeError", f"{type(e).__name__}: {e}"


def run_command(work, *args):
    """Run a script's `work(*args)`: its exit status, 0; a SingaError's one line on stderr and
    its `exit_code`; 130 on Ctrl-C."""
    try:
        work(*args)
    except SingaError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are a ConfigError (one line with the usage, exit 2), raised
    from parse_args for the command's own handler to print."""

    def error(self, message):
        raise ConfigError(f"{message}; {self.format_usage().strip()}")

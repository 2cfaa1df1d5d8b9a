"""SINGA-style log lines (glog's `I1121 23:40:01.123456  4242 worker.py:98] msg`) and log files."""
import logging
import os
import sys
import time

LOGGER = logging.getLogger("singa")
#: `extra=` of an info line that the Python API shows even without `verbose`
SHOWN = {"shown": True}
#: `extra=` of an error line whose error the process also raises: the Python API, which hands
#: it to the caller, does not print it as well
RAISED = {"raised": True}


class GlogFormatter(logging.Formatter):
    """`<level letter><mmdd> <hh:mm:ss.uuuuuu> <thread id> <file>:<line>] <message>`."""

    def format(self, record):
        t = time.localtime(record.created)
        us = int((record.created % 1) * 1e6)
        head = (f"{record.levelname[0]}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{us:06d} "
                f"{record.thread % 100000:5d} {record.filename}:{record.lineno}] ")
        text = head + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def format_metrics(metrics):
    """SINGA's display of {name: value}: `Loss = 2.222740, accuracy = 0.201800`."""
    return ", ".join(f"{name} = {value:f}" for name, value in metrics.items())


def format_duration(seconds):
    """`45s`, `3m05s`, `2h04m`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def setup(log_dir=None, name=None, verbose=False):
    """Log to stderr and, when `log_dir` is given, to `<log_dir>/<name>.log`; returns its path."""
    LOGGER.handlers.clear()
    LOGGER.setLevel(logging.DEBUG if verbose else logging.INFO)
    LOGGER.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(GlogFormatter())
    LOGGER.addHandler(console)
    if not log_dir:
        return None
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, f"{name}.log")
    handler = logging.FileHandler(path)
    handler.setFormatter(GlogFormatter())
    LOGGER.addHandler(handler)
    return path

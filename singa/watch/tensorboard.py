"""TensorBoard event files of a job: `<workspace>/tensorboard/<run>/`, so that
`tensorboard --logdir <workspace>` shows its train, validation and test curves, each fresh
run of the workspace apart (a -resume continues its run's folder; `singa.watch.metrics.run_name`).

Written with tensorboardX (pure Python; the optional extra `singa[tensorboard]`). A scalar per
metric and event, tagged `<phase>/<metric>` (`train/loss`, `test/accuracy`; spaces become `_`;
worker groups other than 0 add `/group<g>`), at the event's step and wall time.
"""
import os
import time

import singa
from singa.job.workspace import TENSORBOARD



def hint():
    """The one log line a job without tensorboardX writes."""
    return f"TensorBoard event files need tensorboardX: {pip_install('tensorboard')}"


def pip_install(extra):
    """The command that installs singa's optional extra `extra` (tensorboard, plot) where this
    singa runs: run from a checkout (the SINGA home has pyproject.toml), into it, with the
    venv thirdparty/install.sh made there; else from the package index."""
    if not os.path.isfile(os.path.join(singa.HOME, "pyproject.toml")):
        return f"pip install 'singa[{extra}]'"
    pip = os.path.join(singa.HOME, ".venv", "bin", "pip")
    return f"{pip if os.path.exists(pip) else 'pip'} install -e '{singa.HOME}[{extra}]'"


class EventWriter:
    """Scalars of one run into `<workspace>/tensorboard/` (a file per run, as TensorBoard
    expects: a resumed job adds a file and TensorBoard joins them by step)."""

    def __init__(self, summary_writer):
        self.writer = summary_writer

    @classmethod
    def open(cls, workspace, log, run=""):
        """A writer into `<workspace>/tensorboard/<run>`, or None (after a `log` line) when
        tensorboardX is not installed or the folder cannot be written: events are a view of
        the run, never a reason to stop it."""
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            log(hint())
            return None
        logdir = os.path.join(workspace, TENSORBOARD, run)
        try:
            # made here: tensorboardX's own check-then-make races with the other processes of
            # the job (each worker group's first worker writes its rows into the same run)
            os.makedirs(logdir, exist_ok=True)
            # tensorboardX names a file by the second: the suffix keeps another writer of the
            # same second (another process, a run resumed at once) from truncating this one's
            return cls(SummaryWriter(logdir=logdir, flush_secs=10,
                                     filename_suffix=f".{os.getpid()}.{time.time_ns()}"))
        except OSError as e:
            log(f"TensorBoard events off: cannot write {logdir}: {e.strerror}")
            return None

    def scalars(self, group, step, phase, values, wall_time=None):
        """{metric: value} of `phase` at `step` by worker group `group`, at `wall_time`
        (seconds since the epoch; None: now)."""
        suffix = f"/group{group}" if group else ""
        for name, value in values.items():
            tag = f"{phase}/{name.lower().replace(' ', '_')}{suffix}"
            self.writer.add_scalar(tag, float(value), step, walltime=wall_time)

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()

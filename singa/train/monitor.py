"""Monitor: what a worker of group 0 measures and a snapshot carries on, the latest test and
validation and the best value of the job's monitored metric (checkpoint_keep_best), for
checkpoint_on_improvement.

A snapshot records the metrics as `<phase>/<name>` with `<phase>@step`, and the best so far
as `best/<phase>/<metric>`; a run resumed from it goes on as the unbroken run would.
"""
import numpy as np

from singa.checkpoint import lower_is_better
from singa.errors import ConfigError
from singa.job.config import parse_monitor

__all__ = ["Monitor"]

PHASES = ("test", "validation")


class Monitor:
    """The latest (step, {metric: value}) of each phase and the best monitored value, for a
    job's `checkpoint_keep_best` / `checkpoint_on_improvement`; `recorded` restores what a
    resumed snapshot recorded (its SnapshotState.metrics)."""

    def __init__(self, job, recorded=None):
        self.name = job.checkpoint_keep_best
        self.phase, self.metric = parse_monitor(self.name) if self.name else (None, None)
        self.on_improvement = job.checkpoint_on_improvement
        self.last = dict.fromkeys(PHASES)
        self.best = None
        self.checked = False
        if recorded:
            self.restore(recorded)

    def record(self, phase, step, metrics, check=True):
        """The metrics of the test or validation at `step`. At the monitored phase's first
        event, with `check`, a ConfigError if no layer produced the monitored metric (the conf
        check cannot know a user layer's that declares no METRICS)."""
        self.last[phase] = (step, dict(metrics))
        if check and phase == self.phase and not self.checked:
            self.checked = True
            if self.metric not in metrics:
                raise ConfigError(f'checkpoint_keep_best "{self.name}": the {phase} net\'s '
                                  f'layers produce {", ".join(sorted(metrics)) or "no metrics"}')

    def improved(self, step):
        """checkpoint_on_improvement: whether the monitored phase's event at `step` bettered
        the best so far (this run's and the resumed run's), compared as float32, as snapshots
        record them, so that a resumed run decides as the unbroken one; every worker of group
        0 sees the same metrics, so all decide alike."""
        if not self.on_improvement or self.phase is None:
            return False
        last = self.last[self.phase]
        if last is None or last[0] != step or self.metric not in last[1]:
            return False
        value = float(np.float32(last[1][self.metric]))    # as a snapshot records it
        if self.best is not None and not (value < self.best if lower_is_better(self.metric)
                                          else value > self.best):
            return False
        self.best = value
        return True

    def recorded(self):
        """What a snapshot records: the latest of each phase, `<phase>/<name>` with the step of
        each (`<phase>@step`), and the best so far (`best/<monitor>`)."""
        out = {}
        for phase, last in self.last.items():
            if last and last[1]:
                out[f"{phase}@step"] = float(last[0])
                out.update((f"{phase}/{k}", v) for k, v in last[1].items())
        if self.best is not None:
            out[f"best/{self.phase}/{self.metric}"] = self.best
        return out

    def restore(self, recorded):
        """Take up what `recorded` (a snapshot's) wrote: the latest of each phase, and the best
        (a snapshot without it: its own monitored value, the best that run could know of)."""
        for phase in PHASES:
            if f"{phase}@step" in recorded:
                values = {k.split("/", 1)[1]: v for k, v in recorded.items()
                          if k.startswith(phase + "/")}
                self.last[phase] = (int(recorded[f"{phase}@step"]), values)
        if self.phase is not None:
            key = f"{self.phase}/{self.metric}"
            self.best = recorded.get(f"best/{key}", recorded.get(key))

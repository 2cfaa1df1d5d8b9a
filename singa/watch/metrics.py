"""What a run reports: metric rows in `<workspace>/metrics.csv`, and the History of a run.

metrics.csv has a header and one row per metric of each display, test and validation event:
`job,group,step,phase,metric,value,wall_time` (phase: train, validation or test; wall_time:
seconds since the epoch). Worker 0 of each worker group writes its group's rows (train
rows: groups other than 0 train asynchronously, Downpour/Hogwild; only group 0 tests and
validates); the log, the plot, the console and History show group 0's. Rows are appended and
flushed as they happen, so a resumed job continues the file and other processes (the Python
API's launcher) read it while it grows; the processes of one job on one host share the file,
each write under an exclusive lock (one header, whole rows).
The same events go to TensorBoard event files (`singa.watch.tensorboard`) when tensorboardX is there,
a folder per run (`run_name`).

A workspace's file holds every run made in it. `runs` cuts it into runs and `newest_run`
picks the newest with the runs it continued (a -resume), which the plot and TensorBoard show
by default: a fresh re-run is not mixed with an earlier run's rows.
"""
import csv
import fcntl
import io
import logging
import os
import threading
import time

from singa.checkpoint.snapshots import lower_is_better
from singa.job.workspace import METRICS
from singa.log import format_duration, format_metrics
from singa.naming import plain
from singa.watch.tensorboard import EventWriter

FIELDS = ("job", "group", "step", "phase", "metric", "value", "wall_time")
PHASES = ("train", "validation", "test")


class Reporter:
    """Where the displaying worker reports: rows to `<workspace>/metrics.csv`, each event also
    to `listener(step, phase, {name: value})` when given; snapshot paths to `on_snapshot(step,
    path)`. Thread-safe (a process's workers share it)."""

    def __init__(self, workspace, job_id, listener=None, on_snapshot=None):
        self.workspace = workspace
        self.path = os.path.join(workspace, METRICS)
        self.job_id = job_id
        self.listener, self.on_snapshot = listener, on_snapshot
        self.lock = threading.Lock()
        self.file = None
        self.run = None         # run_name of this run, known at its first event
        self.events = None      # the TensorBoard EventWriter, once the first event came
        self.started = time.monotonic()
        self.last = {}          # phase -> (step, {metric: value}) of group 0's latest event
        self.best = {}          # (phase, metric) -> (value, step): test and validation
        self.newest = None      # (step, path) of the newest snapshot

    def metrics(self, group, step, phase, values):
        """Record {metric: value} of `phase` at `step` by worker group `group`."""
        if not values:
            return
        now = time.time()
        with self.lock:
            if self.file is None:
                self.file = open(self.path, "a", newline="")
            rows = [(self.job_id, group, step, phase, name.lower(), repr(float(value)),
                     f"{now:.3f}") for name, value in values.items()]
            fcntl.flock(self.file, fcntl.LOCK_EX)
            try:
                first = self.run is None
                if first:               # which run of the workspace this is
                    mine = dict(zip(FIELDS, rows[0]), step=step, wall_time=float(rows[0][-1]))
                    self.run = run_name(newest_run(read_rows(self.path) + [mine]))
                if os.fstat(self.file.fileno()).st_size == 0:
                    rows.insert(0, FIELDS)
                csv.writer(self.file).writerows(rows)
                self.file.flush()
            finally:
                fcntl.flock(self.file, fcntl.LOCK_UN)
            if first:
                self.events = EventWriter.open(self.workspace, logging.getLogger("singa").info,
                                               self.run)
            if self.events is not None:
                self.events.scalars(group, step, phase, values, now)
        if group != 0:
            return
        values = {k.lower(): float(v) for k, v in values.items()}
        self.last[phase] = (step, values)
        if phase != "train":
            for name, value in values.items():
                best = self.best.get((phase, name))
                if best is None or (value < best[0] if lower_is_better(name) else value > best[0]):
                    self.best[phase, name] = (value, step)
        if self.listener is not None:
            self.listener(step, phase, values)

    def snapshot(self, step, path):
        self.newest = (step, path)
        if self.on_snapshot is not None:
            self.on_snapshot(step, path)

    def summary(self, first_step, last_step, resume_hint):
        """The lines that end a run that trained steps `first_step`..`last_step`: steps and
        time, the last and best test and validation metrics, the newest snapshot, how to resume
        (`resume_hint`) and inspect it."""
        took = time.monotonic() - self.started
        lines = [f"Trained steps {first_step}-{last_step} in {format_duration(took)}"
                 + (f" ({(last_step - first_step) / took:.3g} steps/s)" if took > 0 else "")]
        for phase in ("test", "validation"):
            if phase in self.last:
                step, values = self.last[phase]
                best = ", ".join(f"{name} = {value:f} @ step {at}" for (p, name), (value, at)
                                 in self.best.items() if p == phase)
                lines.append(f"Last {phase} @ step {step}:  {format_metrics(values)};  "
                             f"best: {best}")
        if self.newest is not None:
            folder = os.path.dirname(os.path.dirname(self.newest[1]))
            lines += [f"Newest snapshot: {self.newest[1]}",
                      f"Resume: {resume_hint};  inspect: bin/singa-checkpoint.sh ls {folder}"]
        return lines

    def close(self):
        with self.lock:
            if self.file is not None:
                self.file.close()
                self.file = None
            if self.events is not None:
                self.events.close()
                self.events = None


def partition_mean(rows):
    """Each metric averaged over the partitions of a net: `rows[j]` is partition j's
    [{name: value} per layer], the same names in the same order in every partition, each a
    mean over its equal part of the batch, so together the whole batch's."""
    total = [dict(values) for values in rows[0]]
    for theirs in rows[1:]:
        for mine, values in zip(total, theirs):
            for k, v in values.items():
                mine[k] += v
    return [{k: v / len(rows) for k, v in values.items()} for values in total]


def unrolled_mean(metrics):
    """[{name: value}] per layer of a net unrolled over time from `metrics` ({layer name:
    {name: value}}): each metric averaged over the unrolled copies `<t>#<layer>` of a layer
    (SINGA sums them)."""
    copies = {}
    for name, values in metrics.items():
        copies.setdefault(plain(name), []).append(values)
    return [{k: sum(v[k] for v in values) / len(values) for k in values[0]}
            for values in copies.values()]


def read_rows(path, job_id=None):
    """The rows of metrics.csv `path` ({field: value}, value and step as numbers), those of
    job `job_id` when given; a row lacking a field (a torn last line: a writer killed mid-row)
    is skipped."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        if any(row.get(name) is None for name in FIELDS):
            continue        # not a whole row of ours (or a file without our header)
        try:
            row = dict(row, job=int(row["job"]), group=int(row["group"]), step=int(row["step"]),
                       value=float(row["value"]), wall_time=float(row["wall_time"]))
        except (TypeError, ValueError, KeyError):
            continue
        if job_id is None or row["job"] == job_id:
            rows.append(row)
    return rows


def runs(rows):
    """metrics.csv `rows` (in file order) cut into runs, [[row]]: a run is the rows of one job
    (several processes of a job write into one file) until a group's step goes back or a row
    repeats, which starts another (jobs run in-process, through the Python API, all have job
    id -1). A resume cut off its run begins above step 0, so `newest_run` joins them again."""
    out, last, seen = [], {}, set()
    for row in rows:
        key = (row["group"], row["phase"], row["step"], row["metric"])
        if not out or row["job"] != out[-1][0]["job"] or key in seen \
                or row["step"] < last.get(row["group"], 0):
            out.append([])
            last, seen = {}, set()
        out[-1].append(row)
        last[row["group"]] = row["step"]
        seen.add(key)
    return out


def newest_run(rows):
    """The rows of the newest run of metrics.csv `rows` and of the runs it continued: a run
    that begins above step 0 resumed the run before it (a fresh start begins at step 0, or at
    the conf's `step`, which reads as a resume), and so on back."""
    cut = runs(rows)
    first = len(cut) - 1
    while first > 0 and min(r["step"] for r in cut[first]) > 0:
        first -= 1
    return [r for run in cut[first:] for r in run]


def run_name(rows):
    """The name of the run `rows` (what `newest_run` returns) continue: the UTC time of its
    first row, to the millisecond metrics.csv keeps, and its job id
    (`20261125-034436.722-job12`); a -resume gets the name of the run it continues."""
    first = rows[0]
    seconds, ms = divmod(round(first["wall_time"] * 1000), 1000)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(seconds)) + f".{ms:03d}"
    return f"{stamp}-job{first['job']}" if first["job"] >= 0 else stamp


class History:
    """What `Model.fit` returns: the metrics of each event as floats, and the snapshots.

    `history[phase]` is [(step, {metric: value})] in step order (phase: "train", "validation",
    "test"; another is a KeyError); `history.history` the same as Keras' {name: [values]};
    `snapshots` is [(step, path of worker 0's file)]; `last(phase)` the newest
    metrics of a phase ({} if none); `stopped_by` the signal that stopped the run (after a
    snapshot) before its last step, or None.
    """

    def __init__(self):
        self.events = {phase: [] for phase in PHASES}
        self.snapshots = []
        self.stopped_by = None      # the signal (its number) that stopped the run early

    def add(self, step, phase, values):
        self.events.setdefault(phase, []).append((step, dict(values)))

    def add_snapshot(self, step, path):
        self.snapshots.append((step, path))

    @classmethod
    def from_rows(cls, rows):
        """A History of metrics.csv rows (group 0's)."""
        h = cls()
        events = {}
        for r in rows:
            if r["group"] == 0:
                events.setdefault((r["phase"], r["step"]), {})[r["metric"]] = r["value"]
        for (phase, step), values in events.items():
            h.add(step, phase, values)
        for phase in h.events:
            h.events[phase].sort(key=lambda e: e[0])
        return h

    def __getitem__(self, phase):
        if phase not in self.events:
            raise KeyError(f"History has the phases {', '.join(map(repr, self.events))}; "
                           f"Keras' names ('loss', 'val_loss', ...) are in History.history")
        return self.events[phase]

    @property
    def history(self):
        """Keras' History.history: {metric: [values]} of the train events, `val_<metric>` of
        the validations and `test_<metric>` of the tests, in step order."""
        out = {}
        for phase, prefix in (("train", ""), ("validation", "val_"), ("test", "test_")):
            for _, values in self.events.get(phase, []):
                for k, v in values.items():
                    out.setdefault(prefix + k, []).append(v)
        return out

    def last(self, phase):
        events = self[phase]
        return dict(events[-1][1]) if events else {}

    def __repr__(self):
        counts = ", ".join(f"{p}: {len(e)}" for p, e in self.events.items() if e)
        last = "; ".join(f"{p} @ step {e[-1][0]}: " + ", ".join(f"{k} = {v:.6f}" for k, v in e[-1][1].items())
                         for p, e in self.events.items() if e)
        return f"History({counts or 'empty'}{'; ' + last if last else ''})"

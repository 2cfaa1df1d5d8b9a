"""Snapshots in a checkpoint folder: the files of one step, complete or not; latest and best;
retention; temporaries left by killed writers."""
import dataclasses
import os

from singa.checkpoint.format import (MAX_STEP, CheckpointReader, parse_step_worker,
                                     snapshot_file, tmp_writer)
from singa.checkpoint.meta import SUFFIX, meta_path
from singa.errors import CheckpointError
from singa.files import write_atomic
from singa.job.config import parse_monitor

#: the snapshot files of earlier runs in a checkpoint folder (`start_run`)
EARLIER = "earlier-runs"


@dataclasses.dataclass
class Snapshot:
    """The files of one step; `complete` iff every expected worker file is present and reads."""
    step: int
    files: dict                 # worker id -> path
    nworkers_expected: int
    complete: bool
    problems: list              # "<file>: <why>" lines
    verified: bool = False      # every file carries a matching checksum (False: SINGA's files)
    metrics: dict = dataclasses.field(default_factory=dict)
    #: worker id -> CheckpointReader, parsed and verified: set on the snapshot latest_snapshot
    #: or best_snapshot chose, so that restoring from it reads each file once
    readers: dict = dataclasses.field(default_factory=dict, repr=False)

    def parsed(self):
        """Its parsed files (CheckpointReaders), in worker order: a source of `load_params`."""
        return [self.readers[w] for w in sorted(self.readers)]

    def state_of(self, worker):
        """The SnapshotState worker `worker` continues from (without updater buffers): its
        file's, or worker 0's for a worker beyond the snapshot's (dim-0 readers of every
        partition stand at one place); None for a file SINGA wrote (values only)."""
        return self.readers.get(worker, self.readers.get(0)).snapshot_state(buffers=False)

    def names(self):
        """The names of the params its files hold."""
        return {name for r in self.readers.values() for name in r.names}

    def files_holding(self, name):
        """The paths of its files that hold (a piece of) param `name`, in worker order."""
        return [r.path for r in self.parsed() if name in r.names]


def list_snapshots(folder, nworkers=None, log=None):
    """Every snapshot in `folder`, sorted by step, each with its files verified.

    `nworkers`: the job's workers of group 0; files of workers beyond them are ignored (and
    reported to `log`). Expected workers: the count the files record, else `nworkers` if
    given, else the highest worker id present + 1 (SINGA's files record nothing). A 0-byte
    file is SINGA's empty file of a data-parallel worker >= 1; for worker 0 it is a torn
    write. When both `step<N>-worker<W>` and `...bin` exist, ours (`.bin`) is used. The work
    is in proportion to the files present, whatever ids and counts they claim. No file stays
    parsed (`readers` are empty)."""
    return [_snapshot(folder, step, files, nworkers, keep_readers=False)
            for step, files in sorted(_files_by_step(folder, nworkers, log).items())]


def _files_by_step(folder, nworkers=None, log=None):
    """{step: {worker: path}} of the snapshot files in `folder`, without the files of workers
    >= `nworkers` unless workers 0..W all have one (a snapshot of more workers than the job's,
    whose pieces a job of fewer workers joins)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise CheckpointError(f"cannot list checkpoint folder {folder}: {e.strerror}") from None
    by_step = {}
    for name in names:
        sw = parse_step_worker(name)
        if sw is None:
            continue
        files = by_step.setdefault(sw[0], {})
        if sw[1] not in files or name.endswith(SUFFIX):
            files[sw[1]] = os.path.join(folder, name)
    if nworkers is None:
        return by_step
    for step, files in sorted(by_step.items()):
        run = next(w for w in range(len(files) + 1) if w not in files)
        for w in sorted(w for w in files if w >= max(nworkers, run)):
            if log is not None:
                log(f"Ignoring checkpoint file {files[w]}: worker {w} is beyond the job's "
                    f"{nworkers} workers")
            del files[w]
        if not files:
            del by_step[step]
    return by_step


def _snapshot(folder, step, files, nworkers, keep_readers=True):
    """The Snapshot of one step's `files`; its readers are kept if it is complete and
    `keep_readers` (else each file's bytes are freed once checked)."""
    if step > MAX_STEP:
        problem = f"step{step}: a step beyond {MAX_STEP}, the last a job can reach"
        return Snapshot(step, files, len(files), False, [problem])
    problems, readers = [], {}
    for w, path in sorted(files.items()):
        try:
            readers[w] = CheckpointReader(path)
        except CheckpointError as e:
            problems.append(str(e))
    recorded = {r.nworkers for r in readers.values() if r.nworkers}
    if len(recorded) > 1:
        problems.append(f"step{step}: files disagree on the number of workers {sorted(recorded)}")
    expected = max(recorded) if recorded else max(nworkers or 0, max(files) + 1)
    missing = expected - sum(1 for w in files if w < expected)
    if missing:
        first = next(w for w in range(len(files) + 1) if w not in files)
        more = f"; {missing - 1} more are missing" if missing > 1 else ""
        problems.append(f"{snapshot_file(folder, step, first)}: missing "
                        f"(the snapshot has {expected} worker files{more})")
    verified = bool(readers) and all(r.verified for r in readers.values())
    for w, r in sorted(readers.items()):
        if r.size == 0 and w == 0:
            problems.append(f"{r.path}: empty (0 bytes), but worker 0's file has the params")
        elif not r.verified and any(o.verified for o in readers.values()):
            problems.append(f"{r.path}: no checksum while the other files of step{step} have one")
        elif r.verified and r.step != step:
            problems.append(f"{r.path}: records step {r.step}, not {step}")
    metrics = readers[0].metrics if 0 in readers else {}
    return Snapshot(step, files, expected, not problems, problems, verified, metrics,
                    readers if keep_readers and not problems else {})


def files_of(path):
    """The files of the snapshot whose worker file `path` is (`step<N>-worker<W>[.bin]`), in
    worker order, listed by name and not read; [path] for another file."""
    folder, name = os.path.split(path)
    sw = parse_step_worker(name)
    files = _files_by_step(folder).get(sw[0], {}) if sw else {}
    return [files[w] for w in sorted(files)] or [path]


def snapshot_at(folder, step):
    """The complete snapshot of `step` in `folder`, its files parsed; else a CheckpointError
    naming the first problem."""
    files = _files_by_step(folder).get(step)
    if files is None:
        raise CheckpointError(f"no snapshot of step {step} in {folder}")
    snap = _snapshot(folder, step, files, None)
    if not snap.complete:
        raise CheckpointError(f"snapshot step{step} in {folder} is incomplete: {snap.problems[0]}")
    return snap


def start_run(folder):
    """A run starts afresh in `folder`: the snapshot files there now are an earlier run's,
    recorded in EARLIER by name, inode and mtime (a file the new run writes over is its own
    then: a new inode). A resume continues the newest run that has snapshots
    (`latest_snapshot(..., this_run=True)`), never an earlier run's snapshot of a step the
    new one has not reached."""
    lines = []
    for name in sorted(os.listdir(folder)):
        if parse_step_worker(name):
            st = os.stat(os.path.join(folder, name))
            lines.append(f"{name}\t{st.st_ino}\t{st.st_mtime_ns}\n")
    marker = os.path.join(folder, EARLIER)
    if lines:
        write_atomic(marker, lambda f: f.write("".join(lines).encode()))
    elif os.path.exists(marker):
        os.unlink(marker)


def _of_earlier_runs(folder, by_step):
    """`by_step` (`_files_by_step`'s) without the files of runs before the newest one that
    wrote a snapshot file (`start_run`); as it is when that run wrote none yet (a fresh run
    stopped before its first snapshot leaves the earlier run resumable)."""
    try:
        with open(os.path.join(folder, EARLIER), "rb") as f:   # one line a file: bounded
            text = f.read(1 << 24).decode("utf-8", "replace")
    except FileNotFoundError:
        return by_step
    except OSError as e:
        raise CheckpointError(f"cannot read {os.path.join(folder, EARLIER)}: {e.strerror}") \
            from None
    earlier = {tuple(line.split("\t")) for line in text.splitlines()}

    def is_earlier(path):
        st = os.stat(path)
        return (os.path.basename(path), str(st.st_ino), str(st.st_mtime_ns)) in earlier
    own = {step: {w: p for w, p in files.items() if not is_earlier(p)}
           for step, files in by_step.items()}
    if not any(own.values()):
        return by_step
    return {step: files for step, files in own.items() if files}


def latest_snapshot(folder, nworkers=None, log=None, this_run=False):
    """The newest complete snapshot (or None); each newer broken one, and each file beyond the
    job's `nworkers`, is reported to `log`. `this_run` (a resume): of the newest run that
    wrote snapshots (`start_run`).

    Steps are verified newest first, up to the first complete one, whose `readers` hold its
    parsed files."""
    by_step = _files_by_step(folder, nworkers, log)
    if this_run:
        by_step = _of_earlier_runs(folder, by_step)
    for step, files in sorted(by_step.items(), reverse=True):
        snap = _snapshot(folder, step, files, nworkers)
        if snap.complete:
            return snap
        if log is not None:
            for problem in snap.problems:
                log(f"Skipping checkpoint step{snap.step}: {problem}")
    return None


#: metrics that improve downwards, besides any whose name says "error"
LOWER_IS_BETTER = frozenset({"loss", "ppl", "perplexity", "se", "mse", "squared error"})


def lower_is_better(metric):
    """Loss, perplexity (ppl), squared error (se) and any error go down; the others (accuracy,
    precision, ...) go up. The one rule for retention, "best" and on-improvement snapshots."""
    metric = metric.lower()
    return metric in LOWER_IS_BETTER or "error" in metric


#: what ranks snapshots when no monitor is named: the first that a snapshot records
DEFAULT_MONITORS = ("test/accuracy", "test/loss", "validation/accuracy", "validation/loss")


def recorded(snap, monitor):
    """The value of `monitor` ("[phase/]metric") the snapshot records, or None. Snapshots keep
    `<phase>/<metric>` keys; files written before phases were recorded keep the metrics of the
    test at their step under the bare names."""
    phase, metric = parse_monitor(monitor)
    for key, value in snap.metrics.items():
        key = key.lower()
        if key == f"{phase}/{metric}" or (phase == "test" and key == metric):
            return value
    return None


def ranked(snaps, monitor=None):
    """The snapshots of `snaps` that record `monitor`, best first; among equal values one
    measured at its own step first (a later snapshot that carries the same measurement has
    params nobody measured), then the newer. `monitor` None: test accuracy if any snapshot
    records it, else test loss, validation accuracy, validation loss (the first recorded)."""
    if monitor is None:
        monitor = next((m for m in DEFAULT_MONITORS
                        if any(recorded(s, m) is not None for s in snaps)), DEFAULT_MONITORS[0])
    phase, metric = parse_monitor(monitor)
    sign = 1 if lower_is_better(metric) else -1

    def key(scored):
        value, s = scored
        return sign * value, s.metrics.get(f"{phase}@step", s.step) != s.step, -s.step
    scored = [(recorded(s, monitor), s) for s in snaps]
    return [s for _, s in sorted(((v, s) for v, s in scored if v is not None), key=key)]


def best_of(snaps, monitor=None):
    """The best of `snaps` by `monitor` (see `ranked`), or None."""
    return next(iter(ranked(snaps, monitor)), None)


def best_snapshot(folder, monitor=None, nworkers=None, log=None):
    """The complete snapshot of `folder` best by `monitor` (see `ranked`: the default
    monitor is chosen over all of them), its files parsed; or None."""
    by_step = _files_by_step(folder, nworkers, log)
    snaps = [_snapshot(folder, step, files, nworkers, keep_readers=False)
             for step, files in sorted(by_step.items())]
    best = best_of([s for s in snaps if s.complete], monitor)
    return None if best is None else _snapshot(folder, best.step, by_step[best.step], nworkers)


def prune(folder, keep_newest, keep_best=None, keep_best_k=1):
    """Retention: delete snapshots beyond the newest `keep_newest` complete ones (0 keeps all),
    sparing the best `keep_best_k` by the monitor `keep_best`; returns the deleted paths.

    Every snapshot in `folder` counts, earlier runs' too (the job holds its workspace). Only
    our files (`.bin` and its `.meta`) are deleted, and nothing at or after the newest complete
    snapshot (files of a newer one may still be being written by other workers); a file another
    worker of the job deleted meanwhile is skipped.
    """
    if not keep_newest:
        return []
    snaps = list_snapshots(folder)
    complete = [s for s in snaps if s.complete]
    if not complete:
        return []
    keep = {s.step for s in complete[-keep_newest:]}
    if keep_best:
        keep.update(s.step for s in ranked(complete, keep_best)[:keep_best_k])
    deleted = []
    for snap in snaps:
        if snap.step in keep or snap.step >= complete[-1].step:
            continue
        for path in sorted(snap.files.values()):
            if path.endswith(SUFFIX):
                for p in (path, meta_path(path)):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        continue
                    deleted.append(p)
    return deleted


def remove_stale_temporaries(folder):
    """Delete the temporary files of writes whose process is gone (killed mid-write); returns them."""
    removed = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        pid = tmp_writer(name)
        if pid is None or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed

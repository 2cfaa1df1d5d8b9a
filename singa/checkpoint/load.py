"""Loading params from checkpoint files by (name, piece): SINGA's NeuralNet::Load, plus the
joining of model-partitioned params and their cutting anew; the job's `checkpoint_path`.

In a snapshot of K workers the pieces of a model-partitioned param share its name across the
worker files (SINGA's layout). The pieces are joined along their axis (recorded in our files;
inferred for SINGA's, which record nothing) and each target param takes its rows
`param.cut(n, parts, k)` of the whole, so a snapshot loads into any number of workers.
"""
import os

import numpy as np

from singa import resolve
from singa.checkpoint.format import CheckpointReader, existing_file, folder, parse_step_worker
from singa.checkpoint.snapshots import best_snapshot, latest_snapshot
from singa.device import assign, is_host
from singa.errors import CheckpointError
from singa.layers.param import cut, joined_shape
from singa.log import SHOWN
from singa.naming import is_unrolled, unrolled
from singa.proto import job_pb2


def open_checkpoint_path(entries, workspace, log=None, nworkers=None, monitor=None):
    """`checkpoint_path` entries as CheckpointReaders, in order: "latest" / "best" become that
    snapshot's files in `<workspace>/checkpoint` (of workers below the job's `nworkers`; best by
    `monitor`, the job's checkpoint_keep_best, as retention ranks them); other entries resolve
    against the SINGA home, `.bin` optional."""
    snapshots = folder(resolve(workspace))
    out = []
    for entry in entries:
        if entry == "latest":
            snap = latest_snapshot(snapshots, nworkers, log)
        elif entry == "best":
            snap = best_snapshot(snapshots, monitor, nworkers=nworkers, log=log)
        else:
            out.append(CheckpointReader(existing_file(resolve(entry))))
            continue
        if snap is None:
            what = "complete snapshot" if entry == "latest" else \
                f"complete snapshot recording {monitor or 'a test or validation metric'}"
            raise CheckpointError(f"checkpoint_path \"{entry}\": no {what} in {snapshots}")
        out += snap.parsed()
    return out


def load_checkpoint_path(job, params, warn=None, info=None):
    """Load `params` ({name: Param}) by name from the job's `checkpoint_path` (files skipped:
    `warn`; params loaded: `info`); returns (the readers opened, {name: paths that fed it})."""
    files = open_checkpoint_path(list(job.checkpoint_path), job.cluster.workspace, warn,
                                 job.cluster.nworkers_per_group,
                                 job.checkpoint_keep_best or None)
    if not files:
        return files, {}
    loaded = load_params(files, params, log=info)
    if params and not loaded:
        stored = sorted({n for r in files for n in r.names})
        raise CheckpointError(
            f"checkpoint_path: none of the net's {len(params)} params ({_some(params)}) is in "
            f"{_some([r.path for r in files])}, which hold {_some(stored) or 'no params'}: "
            f"the names differ")
    return files, loaded


def load_owned(job, snapshot, params, log, summary=False):
    """A worker's start (part of SINGA's Worker::InitNetParams): load its owner `params` by
    name from the resumed `snapshot` (its parsed files, read once) or else from the job's
    `checkpoint_path`; a param loaded takes version `job.step` under reset_param_version.
    `log` (a Logger) tells each param loaded or freshly initialised and, with `summary`, what
    checkpoint_path gave in one line. Returns the names loaded."""
    owners = {p.name: p for p in params}
    if snapshot is not None:
        files = snapshot.parsed()
        loaded = load_params(files, owners, log=log.info)
    else:
        files, loaded = load_checkpoint_path(job, owners, log.warning, log.info)
        if files and summary:
            log.info("%s", loaded_line(files, owners, loaded), extra=SHOWN)
    if not files:
        return set()
    for p in params:
        if p.name in loaded:
            if job.reset_param_version:
                p.version = job.step
        else:
            log.info("Param %s: freshly initialised (%s)", p.name,
                     job_pb2.InitMethod.Name(p.proto.init.type))
    return set(loaded)


def loaded_line(files, params, loaded):
    """What `checkpoint_path` gave, in one line: `Loaded 4 of 6 params from <files>`."""
    paths = list(dict.fromkeys(r.path for r in files))
    fresh = len(params) - len(loaded)
    return (f"Loaded {len(loaded)} of {len(params)} params from {', '.join(paths)}"
            + (f" ({fresh} initialised afresh)" if fresh else ""))


def _some(names, k=4):
    names = list(names)
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


def sources(files):
    """`files` (paths or CheckpointReaders) as sources in priority order: the files of one
    snapshot (one folder, one step, `step<N>-worker<W>`) are one source, in worker order, at
    the place of the first of them; any other file is a source of its own."""
    groups = {}
    for f in files:
        r = f if isinstance(f, CheckpointReader) else CheckpointReader(f)
        sw = parse_step_worker(r.path)
        key = (os.path.dirname(os.path.abspath(r.path)), sw[0]) if sw else r.path
        groups.setdefault(key, {})[sw[1] if sw else 0] = r     # a file listed again: the later
    return [[g[w] for w in sorted(g)] for g in groups.values()]


def load_params(files, params, log=None):
    """SINGA's NeuralNet::Load by (name, piece): copy values and versions from each source of
    `files` (see `sources`) in order, later sources winning per name; returns {param name:
    paths of the files that fed it}.

    `params`: {name: Param}; a Param whose `partition` is (axis, k, parts) takes rows
    cut(n, parts, k) along `axis` of the whole, joined from the source's pieces. A 0.1 name
    (`w1`, no `0#`) fills param `0#w1` unless the same file also has `0#w1`. Pieces that do
    not join, or a whole that does not fit the param, are a CheckpointError (never another
    worker's piece); a piece takes the oldest version of the stored pieces it overlaps.
    """
    loaded, how = {}, {}
    for source in sources(files):
        for r in source:
            if log is not None:
                log(f"Load from checkpoint file {r.path}")
        for name, entries in _entries(source, params).items():
            how[name] = Joined(name, entries, params[name]).fill(params[name])
            loaded[name] = tuple(r.path for r, _ in entries)
    if log is not None:
        for name in params:
            log(f"Param {name}: {how[name]}" if name in how
                else f"Param {name}: not in the checkpoint files")
    return loaded


def _entries(source, params):
    """{param name: [(reader, stored name)]} of the params of `params` the source holds."""
    out = {}
    for r in source:
        stored = set(r.names)
        for name in r.names:
            target = name
            if name not in params and not is_unrolled(name) and unrolled(name) not in stored:
                target = unrolled(name)
            if target in params:
                out.setdefault(target, []).append((r, name))
    return out


class Joined:
    """The whole of one param from its stored entries [(reader, stored name)] (one, or the
    pieces of one snapshot in worker order): `shape`, the join `axis` (None for one whole
    entry) and each entry's `offsets` along it. `target` (a Param) fixes the whole's shape
    for SINGA's pieces, whose axis is the one along which they join into a whole it fits;
    `prefer` is taken among several such axes (else they are an error)."""

    def __init__(self, name, entries, target=None, prefer=None):
        self.name, self.entries = name, entries
        shapes = [r.shape(n) for r, n in entries]
        recorded = [r.piece(n) for r, n in entries]
        if any(recorded):
            self.entries = self._by_recorded_piece(recorded)
            shapes = [r.shape(n) for r, n in self.entries]
            self.axis = next(p for p in recorded if p)[0]
            if not _joins(shapes, self.axis):
                raise self._error(f": pieces do not join along their axis {self.axis}")
        elif len(entries) == 1:
            self.axis = None
        else:
            axes = [a for a in range(len(shapes[0])) if _joins(shapes, a)
                    and (target is None or _fits(joined_shape(shapes, a), target))]
            if prefer in axes:
                axes = [prefer]
            if len(axes) != 1:
                why = "along no axis" if not axes else f"along axes {axes} alike (ambiguous)"
                expects = "" if target is None else f" into {_expected(target)}"
                raise self._error(f": pieces join{expects} {why}")
            self.axis = axes[0]
        self.shape = shapes[0] if self.axis is None else joined_shape(shapes, self.axis)
        self.offsets, start = [], 0
        for s in shapes:
            self.offsets.append(start)
            start += 0 if self.axis is None else s[self.axis]
        if target is not None and not _fits(self.shape, target):
            what = "has shape" if len(self.entries) == 1 else "joins into shape"
            raise self._error(f" {what} {self.shape}, the net expects {_expected(target)}")

    def _by_recorded_piece(self, recorded):
        """The entries sorted by their recorded piece: exactly pieces 0..parts-1 of one cut."""
        if not all(recorded) or len({(p[0], p[2]) for p in recorded}) != 1:
            raise self._error(f": the files record different cuts {recorded}")
        parts = recorded[0][2]
        ks = sorted(p[1] for p in recorded)
        if len(ks) != parts or ks != list(range(parts)):   # a file's `parts` may be huge
            raise self._error(f": the files hold pieces {ks} of {parts}, not all")
        return [e for _, e in sorted(zip((p[1] for p in recorded), self.entries))]

    def _error(self, why):
        files = (self.entries[0][0].path if len(self.entries) == 1 else
                 ", ".join(f"{r.path} {r.shape(n)}" for r, n in self.entries))
        return CheckpointError(f"checkpoint {files}: param {self.name}{why}")

    def fill(self, p):
        """Copy `p`'s rows of the whole into `p.data` and set `p.version`; returns how, as in
        `joined from a [0:5] + b [5:10], rows 0:5`."""
        out = p.data if is_host(p.data) else np.empty(p.data.shape, np.float32)
        fed = self.copy_into(out, p.partition, lambda r, n: r.view(n))
        if out is not p.data:       # a GPU's param
            assign(p.data, out)
        p.version = min(r.version(n) for r, n in fed or self.entries)
        if self.axis is None:
            how = f"loaded from {self.entries[0][0].path}"
        else:
            along = "" if self.axis == 0 else f" along axis {self.axis}"
            how = "joined from " + " + ".join(
                f"{r.path} [{o}:{o + r.shape(n)[self.axis]}]"
                for (r, n), o in zip(self.entries, self.offsets)) + along
        if p.partition is not None:
            axis, k, parts = p.partition
            a, b = cut(self.shape[axis], parts, k)
            how += f", {'rows' if axis == 0 else f'axis {axis}'} {a}:{b}"
        return how

    def whole(self):
        """The joined values as a new array."""
        out = np.empty(self.shape, np.float32)
        self.copy_into(out, None, lambda r, n: r.view(n))
        return out

    def copy_into(self, out, partition, arrays):
        """Copy into `out` its part of the whole, `arrays(reader, stored name)` giving each
        entry's (values, or a buffer of the param's shape): all of it when `partition` is None,
        else rows cut(n, parts, k) along `axis` of partition (axis, k, parts); returns the
        entries that overlapped it."""
        start = [0] * len(self.shape)
        if partition is not None:
            axis, k, parts = partition
            start[axis] = cut(self.shape[axis], parts, k)[0]
        fed = []
        for (r, n), offset in zip(self.entries, self.offsets):
            at = [0] * len(self.shape)
            if self.axis is not None:
                at[self.axis] = offset
            if _copy_overlap(out, start, arrays(r, n), at):
                fed.append((r, n))
        return fed


def updater_state(snapshot, p):
    """The updater buffers of Param `p` in `snapshot` (the one a -resume continues from),
    joined across its files and cut for `p` as its values are; [] when some piece has none or
    the pieces hold different counts (the updater then starts afresh)."""
    entries = [(r, p.name) for r in snapshot.parsed() if p.name in r.names]
    if not entries:
        return []
    joined = Joined(p.name, entries, p)
    counts = {len(r.buffers(n)) for r, n in joined.entries}
    if len(counts) != 1:
        return []
    out = []
    for i in range(counts.pop()):
        out.append(np.empty(p.data.shape, np.float32))
        joined.copy_into(out[-1], p.partition, lambda r, n: r.buffers(n)[i])
    return out


def _joins(shapes, axis):
    """The shapes have `axis` and agree on every other axis."""
    return all(len(s) == len(shapes[0]) > axis for s in shapes) and all(
        s[:axis] + s[axis + 1:] == shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes)


def _fits(whole, p):
    """A whole of shape `whole` gives param `p` its values: its shape, or when `p` is piece k
    of `parts` along `axis`, the same on every other axis and cut(n, parts, k) rows of n."""
    if p.partition is None:
        return tuple(whole) == tuple(p.data.shape)
    axis, k, parts = p.partition
    a, b = cut(whole[axis], parts, k) if len(whole) > axis else (0, -1)
    return _joins([tuple(whole), tuple(p.data.shape)], axis) and b - a == p.data.shape[axis]


def _expected(p):
    shape = tuple(p.data.shape)
    if p.partition is None:
        return str(shape)
    axis, k, parts = p.partition
    return f"{shape} as piece {k} of {parts} along axis {axis}"


def _copy_overlap(dst, dst_at, src, src_at):
    """Copy into `dst` the part of `src` that overlaps it, both placed in one whole at the
    given start indices; False if they do not overlap."""
    lo = [max(a, b) for a, b in zip(dst_at, src_at)]
    hi = [min(a + n, b + m) for a, n, b, m in zip(dst_at, dst.shape, src_at, src.shape)]
    if any(low >= high for low, high in zip(lo, hi)) and dst.size:
        return False
    dst[tuple(slice(low - a, high - a) for low, high, a in zip(lo, hi, dst_at))] = \
        src[tuple(slice(low - b, high - b) for low, high, b in zip(lo, hi, src_at))]
    return True

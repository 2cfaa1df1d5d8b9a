"""Checkpoint files: SINGA's `BlobProtos` snapshots, written crash-safe, verified, read, pruned.

A snapshot of step N is one file per group-0 worker W,
`<workspace>/checkpoint/step<N>-worker<W>.bin` (SINGA 0.3 writes the same name without `.bin`).
Each file is one `BlobProtos`: SINGA's fields (entry i of `version`, `name`, `blob` belong
together, §2.3), then our additions (step, updater, RNG and reader state, LR index, worker
count, test metrics, fields 300-307) and last a CRC-32 trailer (field 310):
`payload + b"\\xb5\\x13" + crc32(payload)` as little-endian uint32, payload = all bytes before it.
Beside it `step<N>-worker<W>.meta` (the `.bin` suffix replaced; `<path>.meta` for SINGA's
suffix-less files) lists, as text, the file's size and CRC, the step and one line per param:
`param<TAB>name<TAB>shape<TAB>dtype<TAB>version`, shape as `64,784`.

A file is only ever parsed as protobuf, after its size is checked (at most 2 GiB); every array
size is checked against its shape before anything is allocated for it.
"""
import argparse
import dataclasses
import math
import os
import re
import struct
import sys
import zlib

import numpy as np
from google.protobuf.message import DecodeError

from singa.config import resolve
from singa.errors import CheckpointError, SingaError
from singa.proto import common_pb2

SUFFIX = ".bin"
META_SUFFIX = ".meta"
#: Larger files are refused before reading (SINGA itself cannot read more than 512 MiB).
MAX_FILE_BYTES = 2 << 30
_CRC_TAG = b"\xb5\x13"  # field 310, wire type 5 (fixed32)
_STATE_FIELDS = ("step", "param_state", "rng", "reader", "lr_index", "nworkers",
                 "metric_name", "metric_value", "evaluated")
_NAME_RE = re.compile(r"step(\d+)-worker(\d+)(\.bin)?")


@dataclasses.dataclass
class SnapshotState:
    """What a bit-exact resume needs besides param values: all of it lives in our fields."""
    step: int = 0
    nworkers: int = 1
    lr_index: int = 0
    param_state: dict = dataclasses.field(default_factory=dict)  # name -> [updater buffers]
    rng: dict = dataclasses.field(default_factory=dict)          # name -> PCG64 bit_generator.state
    reader: dict = dataclasses.field(default_factory=dict)       # name -> (offset, skipped)
    metrics: dict = dataclasses.field(default_factory=dict)      # test metric -> value
    evaluated: bool = False     # the step's test/validation ran before the snapshot was taken


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


def snapshot_file(folder, step, worker):
    """Path of worker `worker`'s file of step `step` in `folder` (ours, with `.bin`)."""
    return os.path.join(folder, f"step{step}-worker{worker}{SUFFIX}")


def meta_path(path):
    """The `.meta` beside a snapshot file: `.bin` replaced, else appended."""
    return (path[:-len(SUFFIX)] if path.endswith(SUFFIX) else path) + META_SUFFIX


def parse_step_worker(filename):
    """(step, worker) of a file name `step<N>-worker<W>` or `step<N>-worker<W>.bin`, else None.

    The whole base name must match. SINGA's rule (any name containing "step") would also pick
    `.meta` files, temporary files of an interrupted write (`.step5-worker0.bin.tmp-123`) and
    editor backups (`step5-worker0~`, `step5-worker0.bin.swp`); we ignore all of those.
    """
    m = _NAME_RE.fullmatch(os.path.basename(filename))
    return (int(m.group(1)), int(m.group(2))) if m else None


# ---------------------------------------------------------------------------------------------
# Writing

class CheckpointWriter:
    """One snapshot file's params and state; `close()` writes `<prefix>.bin` and `<prefix>.meta`.

    Crash-safe: each file goes to a temporary name, is flushed, fsynced and renamed, then the
    directory is fsynced. Leaving a `with` block by an exception writes nothing.
    """

    def __init__(self, prefix):
        self.prefix = prefix[:-len(SUFFIX)] if prefix.endswith(SUFFIX) else prefix
        self.path = self.prefix + SUFFIX
        self._msg = common_pb2.BlobProtos()
        self._names = set()
        self._closed = False

    def write(self, name, array, version):
        """Append param `name` (values as float32, row-major) with its `version`."""
        if name in self._names:
            raise ValueError(f"param {name} written twice to {self.path}")
        self._names.add(name)
        self._msg.version.append(version)
        self._msg.name.append(name)
        self._msg.blob.add().MergeFromString(_blob_bytes(array))

    def set_state(self, state):
        """Store a `SnapshotState` in our fields (SINGA ignores them)."""
        m = self._msg
        m.step = state.step
        m.nworkers = state.nworkers
        m.lr_index = state.lr_index
        if state.evaluated:
            m.evaluated = True
        for name, buffers in state.param_state.items():
            ps = m.param_state.add(name=name)
            for b in buffers:
                ps.buffer.add().MergeFromString(_blob_bytes(b))
        for name, st in state.rng.items():
            m.rng.add(name=name, bit_generator=st["bit_generator"],
                      state=st["state"]["state"].to_bytes(16, "little"),
                      inc=st["state"]["inc"].to_bytes(16, "little"),
                      has_uint32=st["has_uint32"], uinteger=st["uinteger"])
        for name, (offset, skipped) in state.reader.items():
            m.reader.add(name=name, offset=offset, skipped=skipped)
        for name, value in state.metrics.items():
            m.metric_name.append(name)
            m.metric_value.append(value)

    def close(self):
        """Write the binary file, then its `.meta`; returns the binary file's path."""
        if self._closed:
            return self.path
        self._closed = True
        payload = self._msg.SerializeToString()
        crc = zlib.crc32(payload)
        trailer = _CRC_TAG + struct.pack("<I", crc)
        size = len(payload) + len(trailer)
        folder = os.path.dirname(self.path) or "."
        try:
            _write_atomic(self.path, payload, trailer)
            _write_atomic(self.prefix + META_SUFFIX, _meta_text(self._msg, self.path, size, crc))
            _fsync_dir(folder)
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {e.strerror}") from None
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()


def write_file(path, params, state=None):
    """Write a snapshot file: `params` = iterable of (name, ndarray, version); `state` optional."""
    with CheckpointWriter(path) as w:
        for name, array, version in params:
            w.write(name, array, version)
        if state is not None:
            w.set_state(state)
    return w.path


def _blob_bytes(array):
    """A serialized BlobProto (shape as varints, data packed float32 LE).

    Built by hand and merged because `RepeatedScalarContainer.extend` converts value by value
    (about 8x slower for large params); the message's serialization is unchanged.
    """
    a = np.ascontiguousarray(array, dtype="<f4")
    raw = a.tobytes()
    parts = [b"\x08" + _varint(d) for d in a.shape]
    if raw:
        parts += [b"\x12", _varint(len(raw)), raw]
    return b"".join(parts)


def _varint(n):
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _write_atomic(path, *chunks):
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _meta_text(msg, path, size, crc):
    lines = ["# singa checkpoint meta: param lines are name, shape, dtype, version",
             f"file {os.path.basename(path)}", f"bytes {size}", f"crc32 {crc:08x}"]
    for field in ("step", "nworkers", "lr_index"):
        if msg.HasField(field):
            lines.append(f"{field} {getattr(msg, field)}")
    lines += [f"metric {n} {v!r}" for n, v in zip(msg.metric_name, msg.metric_value)]
    lines += [f"param\t{n}\t{','.join(map(str, b.shape))}\tfloat32\t{v}"
              for n, v, b in zip(msg.name, msg.version, msg.blob)]
    return ("\n".join(lines) + "\n").encode()


# ---------------------------------------------------------------------------------------------
# Reading

def read_meta(path):
    """Parse a `.meta` file: dict with file, bytes, crc32, step, nworkers, lr_index, metrics,
    params [(name, shape, dtype, version)]; missing keys are absent."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 24)
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read checkpoint meta {path}: {e}") from None
    meta = {"metrics": {}, "params": []}
    for i, line in enumerate(text.splitlines(), 1):
        try:
            if not line or line.startswith("#"):
                continue
            if line.startswith("param\t"):
                _, name, shape, dtype, version = line.split("\t")
                meta["params"].append(
                    (name, tuple(int(d) for d in shape.split(",") if d), dtype, int(version)))
            elif line.startswith("metric "):
                _, name, value = line.split(" ")
                meta["metrics"][name] = float(value)
            else:
                key, value = line.split(" ")
                meta[key] = (value if key == "file" else int(value, 16) if key == "crc32"
                             else int(value))
        except ValueError:
            raise CheckpointError(f"{path}:{i}: not a checkpoint meta line: {line[:60]!r}") \
                from None
    return meta


class CheckpointReader:
    """One snapshot file (`path`, or `path.bin` for a prefix), parsed and verified at open;
    values become arrays on request.

    `verified` is True for our files (checksum matched) and False for SINGA's (no checksum;
    accepted when they parse and are consistent). Anything else is a CheckpointError.
    """

    def __init__(self, path):
        self.path = existing_file(path)
        data = _read_bounded(self.path)
        self.size = len(data)
        self.verified, self.proto = _parse(self.path, data)
        self._index = _check_entries(self.path, self.proto)
        _check_state(self.path, self.proto)
        sw = parse_step_worker(self.path)
        if self.proto.HasField("step"):
            self.step = self.proto.step
        else:
            self.step = sw[0] if sw else None
        self.nworkers = self.proto.nworkers if self.proto.HasField("nworkers") else None
        self.metrics = dict(zip(self.proto.metric_name, self.proto.metric_value))

    @property
    def state(self):
        """The file's SnapshotState, or None when it carries none (SINGA's files)."""
        return _state(self.proto) if self.proto.HasField("step") else None

    @property
    def names(self):
        return list(self.proto.name)

    def meta(self):
        """[(name, shape, dtype, version)] without converting any values."""
        p = self.proto
        return [(n, tuple(b.shape), "float32", v) for n, v, b in zip(p.name, p.version, p.blob)]

    def shape(self, name):
        return tuple(self.proto.blob[self._i(name)].shape)

    def version(self, name):
        return self.proto.version[self._i(name)]

    def param(self, name):
        """Values of param `name` as a new float32 array of its stored shape."""
        return _array(self.proto.blob[self._i(name)])

    def params(self):
        """{name: (values, version)} of every param in the file."""
        p = self.proto
        return {n: (_array(b), v) for n, v, b in zip(p.name, p.version, p.blob)}

    def _i(self, name):
        try:
            return self._index[name]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.path}: no param named {name}") from None


def existing_file(path):
    """`path` if it is a file, else `path.bin` (SINGA confs name our files without suffix)."""
    if os.path.isfile(path):
        return path
    if os.path.isfile(path + SUFFIX):
        return path + SUFFIX
    raise CheckpointError(f"checkpoint file not found: {path} (nor {path}{SUFFIX})")


def _read_bounded(path):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise CheckpointError(f"checkpoint {path}: {size} bytes, more than the "
                                      f"{MAX_FILE_BYTES >> 30} GiB a checkpoint file may have")
            data = f.read(size)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    if len(data) != size:
        raise CheckpointError(f"checkpoint {path}: changed while being read")
    return data


def _parse(path, data):
    """(verified, BlobProtos) of file bytes `data`; see the module docstring for the trailer."""
    trailer = len(data) >= 6 and data[-6:-4] == _CRC_TAG
    crc_ok = trailer and zlib.crc32(memoryview(data)[:-6]) == struct.unpack("<I", data[-4:])[0]
    if not crc_ok:
        _diagnose_by_meta(path, len(data))
    msg = common_pb2.BlobProtos()
    try:
        msg.ParseFromString(data)
    except DecodeError:
        why = "bad checksum" if trailer else "not a BlobProtos message"
        raise CheckpointError(f"checkpoint {path}: {why} (truncated or corrupt)") from None
    if crc_ok:
        return True, msg
    if msg.HasField("crc32"):
        raise CheckpointError(f"checkpoint {path}: bad checksum (corrupt)")
    if any(msg.HasField(f) if f in ("step", "lr_index", "nworkers", "evaluated")
           else len(getattr(msg, f))
           for f in _STATE_FIELDS):
        raise CheckpointError(f"checkpoint {path}: checksum missing (truncated)")
    return False, msg


def _diagnose_by_meta(path, size):
    """A file without a valid checksum whose .meta says it had one was torn: say how."""
    mp = meta_path(path)
    if not os.path.isfile(mp):
        return
    meta = read_meta(mp)
    if meta.get("file") != os.path.basename(path):
        return  # the meta of `step<N>-worker<W>.bin` beside SINGA's `step<N>-worker<W>`
    if "bytes" in meta and meta["bytes"] != size:
        raise CheckpointError(f"checkpoint {path}: truncated or damaged: {size} bytes, "
                              f"{os.path.basename(mp)} records {meta['bytes']}")
    if "crc32" in meta:
        raise CheckpointError(f"checkpoint {path}: bad checksum (corrupt; "
                              f"{os.path.basename(mp)} records crc32 {meta['crc32']:08x})")


def _check_entries(path, msg):
    n = len(msg.name)
    if len(msg.version) != n or len(msg.blob) != n:
        raise CheckpointError(f"checkpoint {path}: {len(msg.version)} versions, {n} names and "
                              f"{len(msg.blob)} blobs; entries must pair up (truncated or corrupt)")
    index = {}
    for i, (name, blob) in enumerate(zip(msg.name, msg.blob)):
        if name in index:
            raise CheckpointError(f"checkpoint {path}: param {name} appears twice")
        index[name] = i
        _check_blob(path, f"param {name}", blob)
    return index


def _check_blob(path, what, blob):
    shape = tuple(blob.shape)
    if any(d < 0 for d in shape) or math.prod(shape) != len(blob.data):
        raise CheckpointError(f"checkpoint {path}: {what} has shape {shape} but "
                              f"{len(blob.data)} values")


def _array(blob):
    return np.array(blob.data, dtype=np.float32).reshape(tuple(blob.shape))


def _check_state(path, msg):
    for ps in msg.param_state:
        for i, b in enumerate(ps.buffer):
            _check_blob(path, f"updater state {i} of {ps.name}", b)
    for r in msg.rng:
        if len(r.state) != 16 or len(r.inc) != 16:
            raise CheckpointError(f"checkpoint {path}: RNG state of {r.name} is not 128-bit")


def _state(msg):
    state = SnapshotState(step=msg.step, nworkers=msg.nworkers if msg.HasField("nworkers") else 1,
                          lr_index=msg.lr_index, evaluated=msg.evaluated,
                          metrics=dict(zip(msg.metric_name, msg.metric_value)))
    for ps in msg.param_state:
        state.param_state[ps.name] = [_array(b) for b in ps.buffer]
    for r in msg.rng:
        state.rng[r.name] = {"bit_generator": r.bit_generator,
                             "state": {"state": int.from_bytes(r.state, "little"),
                                       "inc": int.from_bytes(r.inc, "little")},
                             "has_uint32": r.has_uint32, "uinteger": r.uinteger}
    state.reader = {r.name: (r.offset, r.skipped) for r in msg.reader}
    return state


# ---------------------------------------------------------------------------------------------
# Finding snapshots

def list_snapshots(folder, nworkers=None):
    """Every snapshot in `folder`, sorted by step, each with its files verified.

    Expected workers: the count the files record (`nworkers`), else `nworkers` if given, else
    the highest worker id present + 1 (SINGA's files record nothing). A 0-byte file is SINGA's
    empty file of a data-parallel worker >= 1; for worker 0 it is a torn write. When both
    `step<N>-worker<W>` and `...bin` exist, ours (`.bin`) is used.
    """
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
    return [_snapshot(folder, step, files, nworkers) for step, files in sorted(by_step.items())]


def _snapshot(folder, step, files, nworkers):
    problems, readers = [], {}
    for w, path in sorted(files.items()):
        try:
            readers[w] = CheckpointReader(path)
        except CheckpointError as e:
            problems.append(str(e))
    recorded = {r.nworkers for r in readers.values() if r.nworkers}
    if len(recorded) > 1:
        problems.append(f"step{step}: files disagree on the number of workers {sorted(recorded)}")
    expected = max(recorded) if recorded else nworkers or max(files) + 1
    for w in range(expected):
        if w not in files:
            problems.append(f"{snapshot_file(folder, step, w)}: missing "
                            f"(the snapshot has {expected} worker files)")
    verified = bool(readers) and all(r.verified for r in readers.values())
    for w, r in sorted(readers.items()):
        if r.size == 0 and w == 0:
            problems.append(f"{r.path}: empty (0 bytes), but worker 0's file has the params")
        elif not r.verified and any(o.verified for o in readers.values()):
            problems.append(f"{r.path}: no checksum while the other files of step{step} have one")
        elif r.verified and r.step != step:
            problems.append(f"{r.path}: records step {r.step}, not {step}")
    metrics = readers[0].metrics if 0 in readers else {}
    return Snapshot(step, files, expected, not problems, problems, verified, metrics)


def latest_snapshot(folder, nworkers=None, log=None):
    """The newest complete snapshot (or None); each newer broken one is reported to `log`."""
    for snap in reversed(list_snapshots(folder, nworkers)):
        if snap.complete:
            return snap
        if log is not None:
            for problem in snap.problems:
                log(f"Skipping checkpoint step{snap.step}: {problem}")
    return None


def lower_is_better(metric):
    """Loss goes down, anything else (accuracy) goes up."""
    return metric.lower() == "loss"


def best_snapshot(folder, metric=None, nworkers=None):
    """The complete snapshot with the best recorded test `metric` (ties: the newest), or None.

    `metric` None: "accuracy" if any snapshot records it, else "loss". Names match case-blind.
    """
    snaps = [s for s in list_snapshots(folder, nworkers) if s.complete]
    return _best(snaps, metric)


def _best(snaps, metric):
    def value(s):
        return next((v for k, v in s.metrics.items() if k.lower() == metric.lower()), None)
    if metric is None:
        metric = "accuracy"
        if not any(value(s) is not None for s in snaps):
            metric = "loss"
    scored = [(value(s), s.step, s) for s in snaps if value(s) is not None]
    if not scored:
        return None
    sign = -1 if lower_is_better(metric) else 1
    return max(scored, key=lambda t: (sign * t[0], t[1]))[2]


def resolve_checkpoint_paths(paths, workspace, log=None):
    """`checkpoint_path` entries as files: "latest" / "best" become that snapshot's files in
    `<workspace>/checkpoint`; other entries resolve against the SINGA home, `.bin` optional."""
    folder = os.path.join(resolve(workspace), "checkpoint")
    out = []
    for p in paths:
        if p == "latest":
            snap = latest_snapshot(folder, log=log)
        elif p == "best":
            snap = best_snapshot(folder)
        else:
            out.append(existing_file(resolve(p)))
            continue
        if snap is None:
            what = "complete snapshot" if p == "latest" else "complete snapshot with a test metric"
            raise CheckpointError(f"checkpoint_path \"{p}\": no {what} in {folder}")
        out += [snap.files[w] for w in sorted(snap.files)]
    return out


def load_params(paths, params, log=None):
    """SINGA's NeuralNet::Load: copy values and versions by name from each file in order (later
    files win); returns {param name: file it was loaded from}.

    A 0.1 name (`w1`, no `0#`) fills param `0#w1` unless the same file also has `0#w1`.
    A stored shape other than the param's is a CheckpointError.
    """
    loaded = {}
    for path in paths:
        r = CheckpointReader(path)
        if log is not None:
            log(f"Load from checkpoint file {path}")
        stored = set(r.names)
        for name in r.names:
            target = name
            if name not in params and "#" not in name and "0#" + name not in stored:
                target = "0#" + name
            p = params.get(target)
            if p is None:
                continue
            if r.shape(name) != p.data.shape:
                raise CheckpointError(f"checkpoint {path}: param {target} has shape {r.shape(name)}"
                                      f", the net expects {p.data.shape}")
            np.copyto(p.data, r.param(name))
            p.version = r.version(name)
            loaded[target] = path
    if log is not None:
        for name in params:
            log(f"Param {name}: loaded from {loaded[name]}" if name in loaded
                else f"Param {name}: not in the checkpoint files")
    return loaded


def prune(folder, keep_newest, keep_best_metric=None, own_steps=()):
    """Retention: delete snapshots beyond the newest `keep_newest` complete ones (0 keeps all),
    sparing the best by `keep_best_metric`; returns the deleted paths.

    Only our files (`.bin` and its `.meta`) of steps in `own_steps` (written by this job) are
    deleted, and nothing at or after the newest complete snapshot (files of a newer one may
    still be being written by other workers).
    """
    if not keep_newest:
        return []
    snaps = list_snapshots(folder)
    complete = [s for s in snaps if s.complete]
    if not complete:
        return []
    keep = {s.step for s in complete[-keep_newest:]}
    if keep_best_metric:
        best = _best(complete, keep_best_metric)
        if best is not None:
            keep.add(best.step)
    deleted = []
    for snap in snaps:
        if snap.step in keep or snap.step >= complete[-1].step or snap.step not in own_steps:
            continue
        for path in sorted(snap.files.values()):
            if path.endswith(SUFFIX):
                for p in (path, meta_path(path)):
                    if os.path.exists(p):
                        os.unlink(p)
                        deleted.append(p)
    return deleted


# ---------------------------------------------------------------------------------------------
# Command line: python -m singa.checkpoint ls|show|diff

def main(argv=None):
    ap = argparse.ArgumentParser(prog="singa-checkpoint",
                                 description="Inspect SINGA checkpoints without building a net.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ls", help="list the snapshots of a workspace").add_argument(
        "folder", help="workspace or its checkpoint folder")
    sub.add_parser("show", help="show a snapshot file's params").add_argument("file")
    d = sub.add_parser("diff", help="compare two snapshot files param by param")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "ls":
            return _cmd_ls(args.folder)
        if args.cmd == "show":
            return _cmd_show(args.file)
        return _cmd_diff(args.a, args.b)
    except SingaError as e:
        print(f"singa-checkpoint: {e}", file=sys.stderr)
        return e.exit_code


def _cmd_ls(folder):
    if os.path.isdir(os.path.join(folder, "checkpoint")):
        folder = os.path.join(folder, "checkpoint")
    snaps = list_snapshots(folder)
    print(f"checkpoint folder {folder}")
    for s in snaps:
        status = ("complete" if s.complete else "INCOMPLETE") + (
            "" if s.verified else "  unverified (SINGA)")
        metrics = "  ".join(f"{k}={v:.6g}" for k, v in s.metrics.items())
        workers = ",".join(map(str, sorted(s.files))) or "-"
        print(f"step{s.step}  workers {workers}  {status}  {metrics}".rstrip())
        for p in s.problems:
            print(f"    {p}")
    complete = [s for s in snaps if s.complete]
    print(f"latest: step{complete[-1].step}" if complete else "latest: none (no complete snapshot)")
    bests = [(m, _best(complete, m)) for m in ("accuracy", "loss")]
    for metric, best in bests:
        if best is not None:
            print(f"best ({metric}): step{best.step}")
    if all(best is None for _, best in bests):
        print("best: none (no complete snapshot records a test metric)")
    return 0


def _cmd_show(path):
    r = CheckpointReader(path)
    print(f"file {r.path}")
    print(f"step {r.step if r.step is not None else 'unknown'}")
    print("checksum ok" if r.verified else "unverified (SINGA)")
    if r.nworkers is not None:
        print(f"nworkers {r.nworkers}")
    if r.metrics:
        print("metrics " + "  ".join(f"{k}={v:.6g}" for k, v in r.metrics.items()))
    if r.state is not None:
        s = r.state
        print(f"state: {len(s.param_state)} updater states, {len(s.rng)} RNGs, "
              f"{len(s.reader)} readers, lr_index {s.lr_index}")
    rows = [(n, str(shape), dtype, str(v),
             f"{np.abs(r.param(n)).mean():.6g}" if math.prod(shape) else "-")
            for n, shape, dtype, v in r.meta()]
    _table([("name", "shape", "dtype", "version", "mean|x|")] + rows)
    return 0


def _cmd_diff(path_a, path_b):
    a, b = CheckpointReader(path_a), CheckpointReader(path_b)
    names_a, names_b = set(a.names), set(b.names)
    rows = []
    for name in a.names + [n for n in b.names if n not in names_a]:
        if name not in names_b:
            text = "only in a"
        elif name not in names_a:
            text = "only in b"
        elif a.shape(name) != b.shape(name):
            text = f"shape differs: {a.shape(name)} vs {b.shape(name)}"
        else:
            va, vb = a.param(name), b.param(name)
            text = ("same" if np.array_equal(va, vb, equal_nan=True)
                    else f"max abs diff {np.abs(va - vb).max():.6g}")
            if a.version(name) != b.version(name):
                text += f"  (version {a.version(name)} vs {b.version(name)})"
        rows.append((name, text))
    same = all(text == "same" for _, text in rows)
    _table(rows)
    print("identical" if same else "different")
    return 0 if same else 1


def _table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())

"""What `bin/singa-checkpoint.sh` runs: `python -m singa.checkpoint ls|show|diff|merge`."""
import math
import os
import sys

import numpy as np

from singa.checkpoint.format import folder as snapshots_of
from singa.checkpoint.format import (CheckpointReader, parse_step_worker, snapshot_file,
                                     write_file)
from singa.checkpoint.load import Joined
from singa.checkpoint.snapshots import best_of, list_snapshots, recorded, snapshot_at
from singa.errors import ArgumentParser, CheckpointError, SingaError


def main(argv=None):
    ap = ArgumentParser(prog="singa-checkpoint",
                        description="Inspect SINGA checkpoints without building a net.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ls", help="list the snapshots of a workspace").add_argument(
        "folder", help="workspace or its checkpoint folder")
    sub.add_parser("show", help="show a snapshot file's params").add_argument("file")
    d = sub.add_parser("diff", help="compare two snapshot files param by param")
    d.add_argument("a")
    d.add_argument("b")
    mg = sub.add_parser("merge", help="write a one-worker snapshot file (SINGA's format) from a "
                                      "snapshot of several workers, partitioned params joined")
    mg.add_argument("file", help="any file of the snapshot (its step's files in its folder)")
    mg.add_argument("out", help="the file to write, or a folder for step<N>-worker0.bin")
    mg.add_argument("--axis", type=int, default=0,
                    help="the axis to join SINGA's pieces along where their shapes allow several "
                         "(default 0: SINGA cuts a layer's params by rows)")
    try:
        args = ap.parse_args(argv)
        if args.cmd == "ls":
            return _cmd_ls(args.folder)
        if args.cmd == "show":
            return _cmd_show(args.file)
        if args.cmd == "merge":
            return _cmd_merge(args.file, args.out, args.axis)
        return _cmd_diff(args.a, args.b)
    except SingaError as e:
        print(f"singa-checkpoint: {e}", file=sys.stderr)
        return e.exit_code


def _cmd_ls(folder):
    if os.path.isdir(snapshots_of(folder)):
        folder = snapshots_of(folder)
    snaps = list_snapshots(folder)
    print(f"checkpoint folder {folder}")
    for s in snaps:
        status = ("complete" + ("" if s.verified else "  unverified (SINGA)")
                  if s.complete else "INCOMPLETE")
        metrics = _format_metrics(s.metrics)
        workers = ", ".join(map(str, sorted(s.files)))
        print(f"step{s.step}  worker ids [{workers}]  {status}  {metrics}".rstrip())
        for p in s.problems:
            print(f"    {p}")
    complete = [s for s in snaps if s.complete]
    print(f"latest: step{complete[-1].step}" if complete else "latest: none (no complete snapshot)")
    monitors = sorted({k.lower() if "/" in k else f"test/{k.lower()}"
                       for s in complete for k in s.metrics if "@" not in k})
    for monitor in monitors:
        best = best_of(complete, monitor)
        print(f"best by {monitor}: step{best.step} ({recorded(best, monitor):.6g})")
    if not monitors:
        print("best: none (no complete snapshot records a test or validation metric)")
    return 0


def _format_metrics(recorded):
    """`test@200 loss=0.6 accuracy=0.8  validation@190 ...` (older files: `loss=0.6 ...`)."""
    parts = []
    for phase in ("test", "validation"):
        values = [f"{k.split('/', 1)[1]}={v:.6g}" for k, v in recorded.items()
                  if k.startswith(phase + "/")]
        if values:
            at = recorded.get(f"{phase}@step")
            parts.append(" ".join([f"{phase}@{at:.0f}" if at is not None else phase] + values))
    parts += [f"{k}={v:.6g}" for k, v in recorded.items() if "/" not in k and "@" not in k]
    return "  ".join(parts)


def _cmd_show(path):
    r = CheckpointReader(path)
    print(f"file {r.path}")
    print(f"step {r.step if r.step is not None else 'unknown'}")
    print("checksum ok" if r.verified else "unverified (SINGA)")
    if r.nworkers is not None:
        print(f"nworkers {r.nworkers}")
    if r.metrics:
        print("metrics " + _format_metrics(r.metrics))
    s = r.snapshot_state()
    if s is not None:
        print(f"state: {len(s.param_state)} updater states, {len(s.rng)} RNGs, "
              f"{len(s.reader)} readers, lr_index {s.lr_index}")
    pieces = _pieces(r)
    rows = [(n, str(shape), dtype, str(v), pieces.get(n, "-"),
             f"{np.abs(r.param(n)).mean():.6g}" if math.prod(shape) else "-")
            for n, shape, dtype, v in r.meta()]
    _table([("name", "shape", "dtype", "version", "piece", "mean|x|")] + rows)
    return 0


def _pieces(r):
    """{name: "k/parts axis a"} of the params of `r` that are pieces of a partitioned param: as
    our files record it; in SINGA's files, those whose name other worker files of the same step
    in the same folder hold too ("k/parts", by worker order, the axis unrecorded)."""
    out = {}
    for n in r.names:
        if r.piece(n) is not None:
            axis, k, parts = r.piece(n)
            out[n] = f"{k}/{parts} axis {axis}"
    sw = parse_step_worker(r.path)
    if out or r.verified or sw is None:
        return out
    folder = os.path.dirname(r.path)
    holders = {}
    for name in sorted(os.listdir(folder or ".")):
        other = parse_step_worker(name)
        if other is not None and other[0] == sw[0] and other[1] != sw[1]:
            try:
                names = CheckpointReader(os.path.join(folder, name)).names
            except CheckpointError:     # `ls` reports it; `show` is about this file
                continue
            for n in names:
                holders.setdefault(n, set()).add(other[1])
    for n in r.names:
        if n in holders:
            workers = sorted(holders[n] | {sw[1]})
            out[n] = f"{workers.index(sw[1])}/{len(workers)}"
    return out


def _cmd_merge(path, out, axis):
    """Join every param of the snapshot `path` belongs to and write them to one file."""
    sw = parse_step_worker(path)
    if sw is None:
        raise CheckpointError(f"{path}: not a snapshot file (step<N>-worker<W>[.bin])")
    snap = snapshot_at(os.path.dirname(path) or ".", sw[0])
    if os.path.isdir(out):
        out = snapshot_file(out, snap.step, 0)
    target = out if out.endswith(".bin") else out + ".bin"
    same = parse_step_worker(target)
    if same and same[0] == snap.step and (os.path.realpath(os.path.dirname(target) or ".") ==
                                          os.path.realpath(os.path.dirname(path) or ".")):
        raise CheckpointError(f"merge: {target} would be a file of the snapshot it merges; "
                              f"write it to another folder")
    entries = {}
    for r in snap.parsed():
        for n in r.names:
            entries.setdefault(n, []).append((r, n))
    params, lines = [], []
    for name, es in entries.items():
        joined = Joined(name, es, prefer=axis)
        params.append((name, joined.whole(), min(r.version(n) for r, n in es)))
        how = (f"joined from {len(es)} pieces along axis {joined.axis}" if len(es) > 1
               else "whole")
        lines.append(f"{name}  {joined.shape}  {how}")
    path = write_file(out, params)
    print("\n".join(lines + [f"wrote {path}"]))
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

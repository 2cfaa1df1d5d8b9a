"""Loading params by name from checkpoint files (SINGA's NeuralNet::Load) and resolving the
job's `checkpoint_path` entries."""
import os

from singa.checkpoint.format import CheckpointReader, existing_file
from singa.checkpoint.snapshots import best_snapshot, latest_snapshot
from singa.config import resolve
from singa.errors import CheckpointError


def open_checkpoint_path(entries, workspace, log=None, nworkers=None, snapshot=None):
    """`checkpoint_path` entries as CheckpointReaders, in order: "latest" / "best" become that
    snapshot's files in `<workspace>/checkpoint` (of workers below the job's `nworkers`); other
    entries resolve against the SINGA home, `.bin` optional. A file of `snapshot` (the one a
    -resume continues from) is its reader, not read again."""
    folder = os.path.join(resolve(workspace), "checkpoint")
    opened = {} if snapshot is None else {r.path: r for r in snapshot.readers.values()}
    out = []
    for entry in entries:
        if entry == "latest":
            snap = latest_snapshot(folder, nworkers, log)
        elif entry == "best":
            snap = best_snapshot(folder, nworkers=nworkers, log=log)
        else:
            path = existing_file(resolve(entry))
            out.append(opened.get(path) or CheckpointReader(path))
            continue
        if snap is None:
            what = "complete snapshot" if entry == "latest" else "complete snapshot with a test metric"
            raise CheckpointError(f"checkpoint_path \"{entry}\": no {what} in {folder}")
        out += [snap.readers[w] for w in sorted(snap.readers)]
    return out


def load_params(files, params, log=None):
    """SINGA's NeuralNet::Load: copy values and versions by name from each file (a path or a
    CheckpointReader) in order (later files win); returns {param name: file it was loaded from}.

    A 0.1 name (`w1`, no `0#`) fills param `0#w1` unless the same file also has `0#w1`.
    A stored shape other than the param's is a CheckpointError.
    """
    loaded = {}
    for f in files:
        r = f if isinstance(f, CheckpointReader) else CheckpointReader(f)
        if log is not None:
            log(f"Load from checkpoint file {r.path}")
        stored = set(r.names)
        for name in r.names:
            target = name
            if name not in params and "#" not in name and "0#" + name not in stored:
                target = "0#" + name
            p = params.get(target)
            if p is None:
                continue
            if r.shape(name) != p.data.shape:
                raise CheckpointError(f"checkpoint {r.path}: param {target} has shape "
                                      f"{r.shape(name)}, the net expects {p.data.shape}")
            r.copy_param(name, p.data)
            p.version = r.version(name)
            loaded[target] = r.path
    if log is not None:
        for name in params:
            log(f"Param {name}: loaded from {loaded[name]}" if name in loaded
                else f"Param {name}: not in the checkpoint files")
    return loaded

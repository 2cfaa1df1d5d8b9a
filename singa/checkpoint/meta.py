"""The `.meta` text beside a snapshot file: what it holds, readable without protobuf, and the
size and CRC a torn or damaged file is diagnosed by."""
import os

from singa.errors import CheckpointError

SUFFIX = ".bin"
META_SUFFIX = ".meta"


def meta_path(path):
    """The `.meta` beside a snapshot file: `.bin` replaced, else appended."""
    return (path[:-len(SUFFIX)] if path.endswith(SUFFIX) else path) + META_SUFFIX


def meta_text(path, msg, arrays, size, crc):
    """The `.meta` text of snapshot file `path`: its size and CRC, step, worker count, LR
    index, metrics, a line per param (name, shape, dtype, version) and per piece."""
    m = msg
    lines = ["# singa checkpoint meta: param lines are name, shape, dtype, version; "
             "piece lines name, axis, k, parts",
             f"file {os.path.basename(path)}", f"bytes {size}", f"crc32 {crc:08x}"]
    for field in ("step", "nworkers", "lr_index"):
        if m.HasField(field):
            lines.append(f"{field} {getattr(m, field)}")
    lines += [f"metric {n} {v!r}" for n, v in zip(m.metric_name, m.metric_value)]
    lines += [f"param\t{n}\t{','.join(map(str, a.shape))}\tfloat32\t{v}"
              for n, v, a in zip(m.name, m.version, arrays)]
    lines += [f"piece\t{p.name}\t{p.axis}\t{p.k}\t{p.parts}" for p in m.piece]
    return ("\n".join(lines) + "\n").encode()


def read_meta(path):
    """Parse a `.meta` file: dict with file, bytes, crc32, step, nworkers, lr_index, metrics,
    params [(name, shape, dtype, version)], pieces {name: (axis, k, parts)}; missing keys are
    absent."""
    try:
        with open(path, "rb") as f:   # at most 16 MiB, and never a buffer larger than the file
            text = f.read(min(os.fstat(f.fileno()).st_size, 1 << 24)).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read checkpoint meta {path}: {e}") from None
    meta = {"metrics": {}, "params": [], "pieces": {}}
    for i, line in enumerate(text.splitlines(), 1):
        try:
            if not line or line.startswith("#"):
                continue
            if line.startswith("param\t"):
                _, name, shape, dtype, version = line.split("\t")
                meta["params"].append(
                    (name, tuple(int(d) for d in shape.split(",") if d), dtype, int(version)))
            elif line.startswith("piece\t"):
                _, name, *piece = line.split("\t")
                axis, k, parts = map(int, piece)
                meta["pieces"][name] = (axis, k, parts)
            elif line.startswith("metric "):     # names may hold spaces ("squared error")
                name, value = line[len("metric "):].rsplit(" ", 1)
                meta["metrics"][name] = float(value)
            else:
                key, value = line.split(" ")
                meta[key] = (value if key == "file" else int(value, 16) if key == "crc32"
                             else int(value))
        except ValueError:
            raise CheckpointError(f"{path}:{i}: not a checkpoint meta line: {line[:60]!r}") \
                from None
    return meta

"""Files written whole or not at all: a temporary name in the same folder, fsync, rename."""
import os

__all__ = ["write_atomic"]


def write_atomic(path, fill):
    """Call `fill(f)` on a new temporary file beside `path`, then rename it to `path`; on any
    failure nothing is left behind and an OSError names `path`."""
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a folder", path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

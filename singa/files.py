"""Files written whole or not at all: a temporary name in the same folder, fsync, rename, then
the folder fsynced (checkpoints have their own writer, checkpoint.format, for two files)."""
import errno
import os

__all__ = ["copy_atomic", "fsync_dir", "replaceable", "write_atomic"]


def replaceable(path):
    """An OSError naming `path` where a rename onto it must not happen: a folder, or another
    file than a regular one (a device, a FIFO: the rename would replace it)."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a folder", path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise OSError(errno.EEXIST, "is not a regular file", path)


def write_atomic(path, fill):
    """Call `fill(f)` on a new temporary file beside `path`, then rename it to `path`; on any
    failure nothing is left behind and an OSError names `path`. A `path` that is a folder, or
    another file than a regular one (a device, a FIFO, which the rename would replace), is
    refused."""
    replaceable(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def copy_atomic(src, dst):
    """Copy the file `src` to `dst`, written whole or not at all (`write_atomic`)."""
    with open(src, "rb") as f:
        data = f.read()
    write_atomic(dst, lambda out: out.write(data))


def fsync_dir(folder):
    """Make the names in `folder` (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

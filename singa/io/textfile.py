"""SINGA's "textfile" store: one record per line, the key is the 0-based line number (src/io/textfile_store.cc)."""
import os

from singa.errors import DataError
from singa.io.base import Store

__all__ = ["TextFileStore"]


class TextFileStore(Store):
    """A text file opened in mode "read", "create" (truncates) or "append".

    read() gives (b"<line number>", line without its b"\\n"), like std::getline; write()
    ignores the key and appends value + b"\\n". No quoting: parsing is the input layer's job.
    """

    def __init__(self, path, mode="read"):
        modes = {"read": "rb", "create": "wb", "append": "ab"}
        if mode not in modes:
            raise ValueError(f"TextFileStore mode must be read, create or append, not {mode!r}")
        self.path = os.fspath(path)
        self.mode = mode
        if mode == "read" and not os.path.isfile(self.path):
            raise DataError(f"{self.path}: no such text file")
        try:
            self._file = open(self.path, modes[mode])
        except OSError as e:
            raise DataError(f"{self.path}: cannot open text file: {e.strerror}") from None
        self._line = 0

    def read(self):
        """Next (key, value) as bytes, or None at the end of the file."""
        line = self._file.readline()
        if not line:
            return None
        key = b"%d" % self._line
        self._line += 1
        return key, line[:-1] if line.endswith(b"\n") else line

    def seek_to_first(self):
        self.seek(0)

    def tell(self):
        """Byte offset of the next line."""
        return self._file.tell()

    def seek(self, offset):
        """Continue reading at byte `offset` (a value from `tell`); keys continue from there."""
        if self.mode != "read":
            raise ValueError("TextFileStore.seek needs read mode")
        if offset < 0:
            raise DataError(f"{self.path}: negative offset {offset}")
        self._file.seek(0)
        self._line = 0
        # The key is a line number, so recount the lines before `offset`.
        left = offset
        while left > 0:
            chunk = self._file.read(min(left, 1 << 20))
            if not chunk:
                break
            self._line += chunk.count(b"\n")
            left -= len(chunk)
        self._file.seek(offset)

    def write(self, key, value):
        """Append value + b"\\n"; the key is ignored (it is the line number)."""
        self._file.write((value.encode() if isinstance(value, str) else value) + b"\n")
        return True

    def flush(self):
        if self.mode != "read":
            self._file.flush()

    def close(self):
        self._file.close()


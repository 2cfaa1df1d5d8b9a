"""A batch's encoded images decoded by worker processes, one per CPU this process may use up
to `MOST` (`images.decode_many`'s engine). Pillow holds the GIL for a third of a JPEG's
decoding (its header parsed in Python, the loop around its decoder, the pixels copied out as
bytes): a process's decoding threads held it 0.31-0.38 ms a 256² JPEG, a ceiling near 3,000
images a second however many cores it has; asking the processes holds it 0.03 ms
(bench/bench_decode_gil.py).

The processes share nothing with this one but messages on pipes and a memory file each
(memfd): the encoded bytes in, the decoded (C, H, W) uint8 pixels out, no pickles. A frame is
a u32 length and its payload, little-endian:

    request  n u32, is_color i32 (-1: None), height u32, width u32 (0 0: not resized), then
             n × (offset u64, length u64, where's length u32, where in UTF-8)
    reply    status u8 (OK, DATA: the DataError's text, FAILED: an exception's), the memory
             file's size u64, then n × (channels, height, width u32, offset u64) or the text

A process reads requests until its standard input ends (this process closed it or died).
"""
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import threading

import numpy as np

from singa import HOME
from singa.errors import DataError

__all__ = ["Batch", "Decoders"]

OK, DATA, FAILED = 0, 1, 2
_HEAD = struct.Struct("<IiII")
_IMAGE = struct.Struct("<QQI")
_REPLY = struct.Struct("<BQ")
_PIXELS = struct.Struct("<IIIQ")
_LENGTH = struct.Struct("<I")
_ALIGN = 64
RUNS = 4    # a batch's runs a process: one finishing early takes the next
# A process's decoding processes at most: each holds some 20 MB of its own, and 8 decode some
# 10,000 256² JPEGs a second, beyond what a GPU trains the zoo nets at.
MOST = 8


class Decoders:
    """`count` decoding processes, started at the first batch. `decode` is decode_many's
    contract: the (C, H, W) uint8 of each (raw, where[, is_color[, size]]) in order, one
    (n, C, H, W) array where all have one shape, else a list (`Batch`); or the first failing
    image's DataError. One batch at a time (calls from several threads wait)."""

    def __init__(self, count):
        self.count = count
        self._workers, self._pid = [], os.getpid()
        self._lock = threading.Lock()

    def decode(self, images):
        images = [tuple(args) + (None,) * (4 - len(args)) for args in images]
        if len({args[2:] for args in images}) > 1:
            raise ValueError("a batch's images are decoded alike (is_color, size)")
        with self._lock:
            for _ in range(2):
                try:
                    return self._decode(images)
                except DataError:
                    raise               # every reply was read: the processes go on
                except _Died as e:
                    died = e            # a process killed under us: once more with new ones
                    self._stop()
                except BaseException:
                    self._stop()        # replies left unread: the next batch gets new ones
                    raise
        after = {1: "", 2: " and the image after it"}.get(died.count,
                                                             f" and the {died.count - 1} after it")
        raise DataError(f"{images[died.first][1]}: the process decoding it{after} died "
                        f"({died.why})")

    def _decode(self, images):
        if self._pid != os.getpid():    # a fork's copy: the processes are its parent's
            self._workers, self._pid = [], os.getpid()
        while len(self._workers) < self.count:
            self._workers.append(_Worker())
        runs = _chunks(images, RUNS * len(self._workers))
        pixels, errors, waiting, busy = Batch(len(images)), {}, list(range(len(runs))), {}
        waiting.reverse()
        ready = select.poll()
        for worker in self._workers[:len(runs)]:
            k = waiting.pop()
            worker.send(*runs[k])
            busy[worker.replies] = worker, k
            ready.register(worker.replies, select.POLLIN)
        while busy:
            for fd, _ in ready.poll():
                worker, k = busy.pop(fd)
                try:
                    worker.receive(pixels)
                except (DataError, RuntimeError, _Died) as e:
                    errors[k] = e       # the first in order is raised once all replies are in
                if waiting and not isinstance(errors.get(k), _Died):    # none for the dead
                    k = waiting.pop()
                    worker.send(*runs[k])
                    busy[fd] = worker, k
                else:
                    ready.unregister(fd)
        died = [k for k, e in errors.items() if isinstance(e, _Died)]
        if died or errors:
            raise errors[min(died or errors)]
        return pixels.result()

    def _stop(self):
        for worker in self._workers:
            worker.stop()
        self._workers = []


def _chunks(images, n):
    """(index of its first image, images) of up to `n` runs of `images` in order, of about
    equal encoded bytes."""
    total, runs, start, done = sum(len(args[0]) for args in images), [], 0, 0
    for i, args in enumerate(images):
        done += len(args[0])
        if done * n >= total * (len(runs) + 1) or i == len(images) - 1:
            runs.append((start, images[start:i + 1]))
            start = i + 1
    return runs


class Batch:
    """A batch of n images' pixels as they come, (C, H, W) uint8 each: copied into one
    (n, C, H, W) array of the first one's shape (one allocation, not one an image), an image
    of another shape kept aside."""

    def __init__(self, n):
        self.n, self.array, self.odd = n, None, {}

    def put(self, i, x):
        if self.array is None:
            self.array = np.empty((self.n,) + x.shape, np.uint8)
        if x.shape == self.array.shape[1:]:
            np.copyto(self.array[i], x)
        else:
            self.odd[i] = x.copy()

    def result(self):
        """The array, or where shapes differ (or there are none) a list of the images."""
        if self.array is None:
            return []
        if not self.odd:
            return self.array
        return [self.odd[i] if i in self.odd else self.array[i] for i in range(self.n)]


class _Died(Exception):
    def __init__(self, first, count, why):
        self.first, self.count, self.why = first, count, why


class _Worker:
    """One decoding process and its memory file, as this process sees them."""

    def __init__(self):
        self.fd = os.memfd_create("singa-decode")
        self.memory, self.size, self.estimate = None, 0, 0
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HOME, env.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys, singa.io.decoders as d; d.main(int(sys.argv[1]))", str(self.fd)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self.fd,), env=env)
        except BaseException:
            os.close(self.fd)
            raise
        self.replies = self.process.stdout.fileno()
        self.first = self.count = 0

    def send(self, first, images):
        """Ask for `images` (index `first` onwards of the batch) to be decoded."""
        self.first, self.count = first, len(images)
        raws = [args[0] for args in images]
        need = sum(len(raw) for raw in raws)
        self._grow(need + (self.estimate + _ALIGN) * len(images))
        head = [_HEAD.pack(len(images), -1 if images[0][2] is None else int(images[0][2]),
                           *(images[0][3] or (0, 0)))]
        at = 0
        for raw, (_, where, _, _) in zip(raws, images):
            self.memory[at:at + len(raw)] = raw
            name = where.encode(errors="surrogateescape")
            head.append(_IMAGE.pack(at, len(raw), len(name)) + name)
            at += len(raw)
        payload = b"".join(head)
        try:
            _write(self.process.stdin.fileno(), _LENGTH.pack(len(payload)) + payload)
        except OSError:
            pass                        # it died: its reply is missing, which receive says

    def receive(self, batch):
        """The images asked for put in `batch` (a `Batch`), or their DataError."""
        frame = _read(self.replies)
        if frame is None:
            raise _Died(self.first, self.count, self._why())
        status, size = _REPLY.unpack_from(frame)
        if size > self.size:
            self._map(size)             # it grew the file
        body = frame[_REPLY.size:]
        if status == DATA:
            raise DataError(body.decode(errors="surrogateescape"))
        if status != OK:
            raise RuntimeError(f"an image decoding process failed: {body.decode()}")
        for k in range(self.count):
            c, h, w, at = _PIXELS.unpack_from(body, k * _PIXELS.size)
            batch.put(self.first + k, np.frombuffer(self.memory, np.uint8, c * h * w, at)
                      .reshape(c, h, w))
            self.estimate = max(self.estimate, c * h * w)

    def _grow(self, need):
        if need > self.size:
            os.ftruncate(self.fd, need)
            self._map(need)

    def _map(self, size):
        if self.memory is not None:
            self.memory.close()
        self.memory, self.size = mmap.mmap(self.fd, size), size

    def _why(self):
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def stop(self):
        self.process.kill()
        self.process.wait()
        for f in (self.process.stdin, self.process.stdout):
            f.close()
        if self.memory is not None:
            self.memory.close()
        os.close(self.fd)


def _write(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd):
    """A frame's payload, or None where the pipe ended."""
    head = _read_exactly(fd, _LENGTH.size)
    return None if head is None else _read_exactly(fd, _LENGTH.unpack(head)[0])


def _read_exactly(fd, n):
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def serve(fd, requests=0, replies=1):
    """A decoding process: answer the requests on `requests` until it ends, the images in the
    memory file `fd` (this module's docstring)."""
    from singa.io.images import decode_image
    memory, size = None, 0
    while True:
        frame = _read(requests)
        if frame is None:
            return
        n, is_color, height, width = _HEAD.unpack_from(frame)
        is_color = None if is_color < 0 else bool(is_color)
        resize = (height, width) if height else None
        at, images = _HEAD.size, []
        for _ in range(n):
            offset, length, name = _IMAGE.unpack_from(frame, at)
            at += _IMAGE.size
            images.append((offset, length, frame[at:at + name].decode(errors="surrogateescape")))
            at += name
        try:
            size = os.fstat(fd).st_size
            if memory is None or len(memory) != size:
                memory = mmap.mmap(fd, size)
            pixels = [decode_image(memory[o:o + length], where, is_color, resize)
                      for o, length, where in images]
            end = -(-max(o + length for o, length, _ in images) // _ALIGN) * _ALIGN
            places = []
            for x in pixels:
                places.append(end)
                end += -(-x.nbytes // _ALIGN) * _ALIGN
            if end > size:
                os.ftruncate(fd, end)
                memory.close()
                memory, size = mmap.mmap(fd, end), end
            body = []
            for x, place in zip(pixels, places):
                np.frombuffer(memory, np.uint8, x.nbytes, place)[:] = x.reshape(-1)
                body.append(_PIXELS.pack(*x.shape, place))
            reply = _REPLY.pack(OK, size) + b"".join(body)
        except DataError as e:
            reply = _REPLY.pack(DATA, size) + str(e).encode(errors="surrogateescape")
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            reply = _REPLY.pack(FAILED, size) + text.encode(errors="backslashreplace")
        try:
            _write(replies, _LENGTH.pack(len(reply)) + reply)
        except OSError:
            return                      # the asking process is gone


def main(fd):
    """A decoding process's life: a terminal's Ctrl-C is its parent's to act on, and what a
    library prints goes to standard error, not into the replies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.dup(1)
    os.dup2(2, 1)
    serve(fd, 0, replies)

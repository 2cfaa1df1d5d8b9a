"""The decoding processes (singa.io.decoders): each batch's pixels are decode_image's, in order,
whatever the processes, shapes and sizes; the first bad image's error; a killed process is
replaced; the processes end with the process that started them."""
import io
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import processes
from singa.errors import DataError
from singa.io.decoders import Decoders, _chunks
from singa.io.images import decode_image

Image = pytest.importorskip("PIL.Image")


def encoded(pixels, form="JPEG", mode=None):
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, form, **({"quality": 90} if form == "JPEG" else {}))
    return buf.getvalue()


def photos(n, size=(40, 56), seed=0):
    rng = np.random.default_rng(seed)
    return [encoded(rng.integers(0, 256, size + (3,), dtype=np.uint8)) for _ in range(n)]


def mixed():
    """JPEG and PNG, colour, gray and with alpha, of several sizes."""
    rng = np.random.default_rng(1)
    return photos(3) + [
        encoded(rng.integers(0, 256, (17, 9), dtype=np.uint8), "PNG"),
        encoded(rng.integers(0, 256, (8, 30, 4), dtype=np.uint8), "PNG"),
        encoded(rng.integers(0, 256, (64, 48, 3), dtype=np.uint8), "PNG"),
        encoded(rng.integers(0, 256, (33, 20), dtype=np.uint8), "JPEG")]


def assert_same(got, images):
    want = [decode_image(*args) for args in images]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.uint8 and g.shape == w.shape and np.array_equal(g, w)


@pytest.fixture
def decoders():
    d = Decoders(3)
    yield d
    d._stop()


@pytest.mark.parametrize("is_color, size", [(None, None), (True, None), (False, None),
                                            (True, (21, 13)), (None, (50, 70))])
def test_a_batch_is_decode_images_pixels_in_order(decoders, is_color, size):
    images = [(raw, f"image {i}", is_color, size) for i, raw in enumerate(mixed() * 3)]
    assert_same(decoders.decode(images), images)


def test_a_batch_of_one_shape_is_one_array_and_of_several_a_list(decoders):
    same = [(raw, f"image {i}") for i, raw in enumerate(photos(5))]
    got = decoders.decode(same)
    assert isinstance(got, np.ndarray) and got.shape == (5, 3, 40, 56)
    assert_same(got, same)
    several = same[:2] + [(encoded(np.zeros((7, 5), np.uint8), "PNG"), "gray")] + same[2:]
    got = decoders.decode(several)
    assert isinstance(got, list)
    assert_same(got, several)


def test_one_cpu_decodes_in_the_calling_thread_to_the_same_batch(monkeypatch):
    from singa.io import images as module
    same = [(raw, f"image {i}") for i, raw in enumerate(photos(4))]
    several = same + [(encoded(np.zeros((7, 5), np.uint8), "PNG"), "gray")]
    monkeypatch.setattr(module, "_decoders", Decoders(1))     # one CPU
    got = module.decode_many(same)
    assert isinstance(got, np.ndarray) and got.shape == (4, 3, 40, 56)
    assert_same(got, same)
    assert isinstance(module.decode_many(several), list)
    assert_same(module.decode_many(several), several)
    assert module._decoders._workers == []                  # no process started


def test_batches_of_any_count_and_growing_images_come_right(decoders):
    """One image for three processes, two, then images larger than the memory files held."""
    for n, size in [(1, (8, 8)), (2, (8, 8)), (7, (8, 8)), (5, (300, 260)), (4, (20, 20))]:
        images = [(raw, f"image {i}") for i, raw in enumerate(photos(n, size, seed=n))]
        assert_same(decoders.decode(images), images)


def test_the_first_bad_image_of_the_batch_is_the_error(decoders):
    raws = photos(9)
    raws[5] = b""
    raws[8] = raws[8][:50]
    images = [(raw, f"db: record '{i}\udcff'") for i, raw in enumerate(raws)]
    with pytest.raises(DataError, match=r"^db: record '5\udcff': not an image Pillow decodes"):
        decoders.decode(images)
    assert_same(decoders.decode(images[:5]), images[:5])     # and the next batch is right
    empty = Decoders(2)
    with pytest.raises(DataError, match=r"^a: not an image Pillow decodes"):
        empty.decode([(b"", "a"), (b"", "b")])              # nothing in its memory files
    empty._stop()


def test_runs_are_in_order_and_of_about_equal_bytes():
    images = [(b"x" * n, str(i)) for i, n in enumerate([10, 10, 10, 10, 30, 10, 10, 10])]
    runs = _chunks(images, 3)
    assert [first for first, _ in runs] == [0, 4, 5]
    assert [args for _, run in runs for args in run] == images
    assert _chunks(images[:2], 3) == [(0, images[:1]), (1, images[1:2])]


def test_a_killed_process_is_replaced_and_the_batch_comes_right(decoders):
    images = [(raw, f"image {i}") for i, raw in enumerate(photos(8))]
    decoders.decode(images)
    victim = decoders._workers[1].process
    victim.kill()
    victim.wait()
    assert_same(decoders.decode(images), images)
    assert victim not in [w.process for w in decoders._workers]


def test_a_batch_interrupted_leaves_no_reply_for_the_next(decoders, monkeypatch):
    """Ctrl-C while the replies come (KeyboardInterrupt in `fit`): the next batch is its own."""
    from singa.io import decoders as module
    first, second = ([(raw, f"{k}/{i}") for i, raw in enumerate(photos(6, seed=k))]
                     for k in (1, 2))
    receive = module._Worker.receive

    def interrupted(self, batch):
        monkeypatch.setattr(module._Worker, "receive", receive)
        raise KeyboardInterrupt
    monkeypatch.setattr(module._Worker, "receive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        decoders.decode(first)
    assert_same(decoders.decode(second), second)


def test_what_a_decoding_process_prints_does_not_reach_its_replies(capfd):
    """A library's print in the decoding process (here: around each decode) goes to standard
    error; the replies on its standard output stay whole."""
    from singa.io import decoders as module
    noisy = ("import sys, singa.io.images as im, singa.io.decoders as d\n"
             "decode = im.decode_image\n"
             "def loud(*args):\n"
             "    print('decoding', args[1], flush=True)\n"
             "    return decode(*args)\n"
             "im.decode_image = loud\n"
             "d.main(int(sys.argv[1]))\n")
    worker = module._Worker.__new__(module._Worker)
    worker.fd = os.memfd_create("test")
    worker.memory, worker.size, worker.estimate = None, 0, 0
    worker.process = subprocess.Popen([sys.executable, "-c", noisy, str(worker.fd)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      pass_fds=(worker.fd,))
    worker.replies = worker.process.stdout.fileno()
    d = Decoders(1)
    d._workers = [worker]
    images = [(raw, f"image {i}") for i, raw in enumerate(photos(3))]
    try:
        assert_same(d.decode(images), images)
    finally:
        d._stop()
    assert "decoding image 2" in capfd.readouterr().err


def test_a_forks_batches_are_decoded_by_processes_of_its_own(decoders):
    """A fork (multiprocessing's default here) of a process that has decoded leaves the
    processes to its parent: the child starts its own, and the parent's still answer it."""
    images = [(raw, f"image {i}") for i, raw in enumerate(photos(6))]
    decoders.decode(images)
    theirs = [w.process.pid for w in decoders._workers]
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = np.array_equal(decoders.decode(images), decoders.decode(images)) and \
                not {w.process.pid for w in decoders._workers} & set(theirs)
            decoders._stop()
        finally:
            os._exit(0 if ok else 1)
    assert_same(decoders.decode(images), images)
    assert os.waitpid(pid, 0)[1] == 0
    assert [w.process.pid for w in decoders._workers] == theirs
    assert_same(decoders.decode(images), images)


def test_processes_that_cannot_decode_at_all_are_one_line_naming_the_images(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    d = Decoders(2)
    images = [(raw, f"db: record '{i}'") for i, raw in enumerate(photos(4))]
    with pytest.raises(DataError, match=r"^db: record '0': the process decoding it died "
                                        r"\(exit status 1\)$"):
        d.decode(images)
    assert d._workers == []


def test_batches_of_several_threads_are_each_their_own(decoders):
    batches = [[(raw, f"{t}/{i}") for i, raw in enumerate(photos(6, seed=t))] for t in range(4)]
    got = [None] * 4

    def decode(t):
        got[t] = [decoders.decode(batches[t]) for _ in range(3)]
    threads = [threading.Thread(target=decode, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in range(4):
        for each in got[t]:
            assert_same(each, batches[t])


@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_the_processes_end_with_the_process_that_started_them(tmp_path, how):
    script = ("import io, os, sys, numpy as np\n"
              "from PIL import Image\n"
              "from singa.io.decoders import Decoders\n"
              "buf = io.BytesIO(); Image.new('RGB', (9, 9)).save(buf, 'PNG')\n"
              "d = Decoders(2); d.decode([(buf.getvalue(), 'a'), (buf.getvalue(), 'b')])\n"
              "print(*[w.process.pid for w in d._workers], flush=True)\n"
              "sys.stdin.readline()\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    if how == "exits":
        parent.stdin.close()
    else:
        parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(processes.alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(processes.alive(p) for p in pids)

"""bin/singa-checkpoint.sh (python -m singa.checkpoint): ls, show, diff, errors."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import singa
from checkpoint_helpers import FIX, cli, snapshot
from singa import checkpoint as ckpt
from singa.checkpoint.cli import main


def test_cli_ls_show_diff(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    snapshot(str(folder), 100, metrics={"accuracy": 0.9, "loss": 0.3})
    snapshot(str(folder), 200, metrics={"accuracy": 0.8, "loss": 0.2})
    out = cli("ls", str(tmp_path))
    assert out.returncode == 0
    assert "latest: step200" in out.stdout and "best by test/accuracy: step100 (0.9)" in out.stdout
    assert "best by test/loss: step200 (0.2)" in out.stdout and "accuracy=0.9" in out.stdout
    assert "step100  worker ids [0]  complete" in out.stdout
    out = cli("show", f"{FIX}/run-1worker/step200-worker0")
    assert out.returncode == 0 and "unverified (SINGA)" in out.stdout
    assert any(line.split()[:5] == ["0#weight1", "(64,", "784)", "float32", "199"]
               for line in out.stdout.splitlines())
    a, b = ckpt.snapshot_file(str(folder), 100, 0), ckpt.snapshot_file(str(folder), 200, 0)
    same = cli("diff", a, a)
    assert same.returncode == 0 and same.stdout.count("same") == 2
    differ = cli("diff", a, f"{FIX}/run-1worker/step100-worker0")
    assert differ.returncode == 1 and "only in a" in differ.stdout and "only in b" in differ.stdout
    assert "max abs diff" in cli("diff", a, b).stdout


def test_cli_output_cut_short_by_its_reader_is_no_traceback(tmp_path):
    big = tmp_path / "big"
    ckpt.write_file(str(big), [(f"p{i}", np.zeros(3, np.float32), 1) for i in range(20000)])
    r = subprocess.run(f"{sys.executable} -m singa.checkpoint show {big}.bin | head -1",
                       shell=True, cwd=singa.HOME, capture_output=True, text=True, timeout=60)
    assert r.stdout == f"file {big}.bin\n" and r.stderr == ""


def test_cli_user_error_is_one_line_exit_2(tmp_path):
    out = cli("show", str(tmp_path / "missing"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "missing" in out.stderr


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: cmd"),
    (["bogus"], "argument cmd: invalid choice: 'bogus'"),
    (["diff", "a"], "the following arguments are required: b"),
    (["show", "a", "extra"], "unrecognized arguments: extra"),
    (["merge", "a", "b", "--axis", "x"], "argument --axis: invalid int value: 'x'")])
def test_cli_command_line_mistake_is_one_line_exit_2(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"singa-checkpoint: {message}") and err.count("\n") == 1
    assert "usage: singa-checkpoint" in err


def test_cli_a_file_of_another_kind_is_one_line(capsys):
    """A Caffe model parses as a BlobProtos of unknown fields alone: `show` listed no params
    and `diff` called it identical to another."""
    model = os.path.join(singa.HOME, "tests/fixtures/caffe/convnet/convnet_iter_30.caffemodel")
    for args in (["show", model], ["diff", model, model]):
        assert main(args) == 2
        assert capsys.readouterr().err == (
            f"singa-checkpoint: checkpoint {model}: no field of a checkpoint in its "
            f"{os.path.getsize(model)} bytes (a file of another kind?)\n")


def test_cli_merge_leaves_an_output_that_is_no_regular_file_alone(tmp_path, capsys):
    """merge renamed its file over a FIFO (or, as root, a device) of the name it was given."""
    snapshot(str(tmp_path), 5)
    fifo = tmp_path / "out" / "merged.bin"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    assert main(["merge", ckpt.snapshot_file(str(tmp_path), 5, 0), str(fifo)]) == 2
    assert capsys.readouterr().err == \
        f"singa-checkpoint: cannot write checkpoint {fifo}: is not a regular file\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(fifo.parent) == ["merged.bin"]

"""singa.plot (bin/singa-plot.sh): a workspace's metrics.csv drawn as a PNG."""
import os
import struct
import subprocess
import sys

import singa
from singa import plot
from singa.metrics import Reporter, read_rows


def write_metrics(workspace, ppl=False):
    """Two runs of one job (the second resumed at step 20, repeating it) into metrics.csv."""
    for job, steps in ((1, range(0, 30, 10)), (2, range(20, 50, 10))):
        r = Reporter(str(workspace), job)
        for s in steps:
            values = {"loss": 2.0 / (s + 1), "accuracy": s / 50}
            r.metrics(0, s, "train", values)
            if ppl:
                r.metrics(0, s, "validation", {"ppl": 100.0 / (s + 1)})
            if s % 20 == 0:
                r.metrics(0, s, "test", values)
        r.close()


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def run(*args):
    return subprocess.run([sys.executable, "-m", "singa.plot", *map(str, args)], cwd=singa.HOME,
                          capture_output=True, text=True, timeout=120)


def test_curves_take_every_run_the_later_row_winning(tmp_path):
    write_metrics(tmp_path)
    rows = [dict(r, value=r["value"] + (r["job"] == 2 and r["step"] == 20))
            for r in read_rows(str(tmp_path / "metrics.csv"))]
    data = plot.curves(rows)
    assert [s for s, _ in data["loss"]["train"]] == [0, 10, 20, 30, 40]
    assert dict(data["loss"]["train"])[20] == 2.0 / 21 + 1          # job 2's row
    assert [s for s, _ in data["accuracy"]["test"]] == [0, 20, 40]


def test_png_of_the_expected_size_with_perplexity_on_a_log_scale(tmp_path):
    write_metrics(tmp_path)
    r = run(tmp_path, "-o", tmp_path / "a.png")
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "a.png") == (plot.WIDTH, plot.ROW_HEIGHT)     # loss, accuracy
    assert r.stdout == f"{tmp_path / 'a.png'}: accuracy, loss (test, train), steps 0 to 40\n"
    (tmp_path / "b").mkdir()
    write_metrics(tmp_path / "b", ppl=True)
    r = run(tmp_path / "b", "-job", 2)
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "b" / "curves.png") == (plot.WIDTH, 2 * plot.ROW_HEIGHT)
    fig = plot.figure(read_rows(str(tmp_path / "b" / "metrics.csv")), "t")
    scales = {ax.get_title(): ax.get_yscale() for ax in fig.axes if ax.get_visible()}
    assert scales == {"loss": "linear", "accuracy": "linear", "ppl": "log"}


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"singa-plot: {tmp_path / 'metrics.csv'}: no metrics file (a job writes " \
                       f"it in its workspace)\n"
    (tmp_path / "metrics.csv").write_text("job,group,step,phase,metric,value,wall_time\n")
    r = run(tmp_path)
    assert r.returncode == 2 and r.stderr == f"singa-plot: {tmp_path / 'metrics.csv'}: no rows\n"
    write_metrics(tmp_path)
    r = run(tmp_path, "-o", tmp_path / "missing" / "x.png")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"singa-plot: cannot write {tmp_path / 'missing' / 'x.png'}: ")


def test_the_script_runs(tmp_path):
    write_metrics(tmp_path)
    r = subprocess.run([os.path.join(singa.HOME, "bin", "singa-plot.sh"), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "curves.png") == (plot.WIDTH, plot.ROW_HEIGHT)

"""singa.watch.plot (bin/singa-plot.sh): a workspace's metrics.csv drawn as a PNG."""
import os
import struct
import subprocess
import sys

import pytest

import singa
from singa.watch import metrics, plot
from singa.watch.metrics import Reporter, read_rows


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
    return subprocess.run([sys.executable, "-m", "singa.watch.plot", *map(str, args)], cwd=singa.HOME,
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


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: workspace"),
    (["w", "-job", "x"], "argument -job: invalid int value: 'x'"),
    (["w", "-job", "1", "-all"], "argument -all: not allowed with argument -job"),
    (["w", "extra"], "unrecognized arguments: extra")])
def test_a_command_line_mistake_is_one_line(capsys, args, message):
    assert plot.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"singa-plot: {message}") and err.count("\n") == 1
    assert "usage: singa-plot" in err


def test_rows_that_cannot_be_drawn_are_left_out_and_counted(tmp_path):
    """nan and infinite values (a diverged run) and negative steps: left out, and the line
    says how many; with nothing left, one line and exit 2."""
    r = Reporter(str(tmp_path), 1)
    for s, loss in ((0, 2.0), (10, float("nan")), (20, float("inf")), (30, 1.0)):
        r.metrics(0, s, "train", {"loss": loss})
    r.metrics(0, -5, "train", {"loss": 1.5})
    r.close()
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"{tmp_path / 'curves.png'}: loss (train), steps 0 to 30; 3 rows "
                           f"left out ({plot.UNDRAWN})\n")
    (tmp_path / "b").mkdir()
    r = Reporter(str(tmp_path / "b"), 1)
    r.metrics(0, 0, "train", {"loss": float("nan")})
    r.close()
    bad = run(tmp_path / "b")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (f"singa-plot: {tmp_path / 'b' / 'metrics.csv'}: none of its 1 rows can "
                          f"be drawn ({plot.UNDRAWN})\n")


def test_the_script_runs(tmp_path):
    write_metrics(tmp_path)
    r = subprocess.run([os.path.join(singa.HOME, "bin", "singa-plot.sh"), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "curves.png") == (plot.WIDTH, plot.ROW_HEIGHT)


def rows_of(*runs):
    """metrics.csv rows of `runs`, each (job id, first step, last step), a train row every 10."""
    return [dict(job=job, group=0, step=s, phase="train", metric="loss", value=1.0,
                 wall_time=1.0) for job, first, last in runs for s in range(first, last + 1, 10)]


def test_runs_and_the_newest_run_with_those_it_resumed():
    # jobs of ZooKeeper: 2 resumed 1 (it starts at step 20), 3 is a fresh re-run
    rows = rows_of((1, 0, 40), (2, 20, 60), (3, 0, 20))
    assert [{r["job"] for r in run} for run in metrics.runs(rows)] == [{1}, {2}, {3}]
    assert {r["job"] for r in metrics.newest_run(rows)} == {3}
    assert {r["job"] for r in metrics.newest_run(rows[:-3])} == {1, 2}
    # jobs run in-process all have id -1: a step going back or a repeated row starts a run;
    # one that starts above step 0 continues the one before
    rows = rows_of((-1, 0, 40), (-1, 40, 60), (-1, 0, 20), (-1, 10, 30))
    assert [len(run) for run in metrics.runs(rows)] == [5, 3, 3, 3]
    assert [r["step"] for r in metrics.newest_run(rows)] == [0, 10, 20, 10, 20, 30]
    assert metrics.newest_run(rows[:8]) == rows[:8]
    rows = rows_of((-1, 0, 0), (-1, 0, 10))      # a fresh re-run after a run of one display
    assert [r["step"] for r in metrics.newest_run(rows)] == [0, 10]
    assert metrics.run_name(rows_of((12, 0, 0))) == "19700101-000001.000-job12"
    assert metrics.run_name([dict(rows[0], wall_time=1764042276.7225)]) == \
        "20251125-034436.722"


def test_a_fresh_rerun_is_drawn_alone_unless_all(tmp_path):
    write_metrics(tmp_path)                 # job 1, then job 2 resumed at step 20
    r = Reporter(str(tmp_path), 3)          # a fresh re-run in the same workspace
    for s in (0, 10):
        r.metrics(0, s, "train", {"loss": 5.0, "accuracy": 0.5})
    r.close()
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'curves.png'}: accuracy, loss (train), steps 0 to 10\n"
    r = run(tmp_path, "-all")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'curves.png'}: accuracy, loss (test, train), steps 0 to 40\n"


def test_rows_lacking_a_field_are_skipped_so_runs_never_fail(tmp_path):
    """A file without our header (or a torn row) gives no rows rather than a KeyError later in
    `runs` (which a metrics report of a running job calls)."""
    path = tmp_path / "metrics.csv"
    path.write_text("job,group,step,metric,value,wall_time\n1,0,5,loss,0.5,1.0\n")
    assert read_rows(str(path)) == []
    path.write_text(",".join(metrics.FIELDS) + "\n1,0,5,train,loss,0.5,1.0\n1,0,6,train\n")
    assert [r["step"] for r in metrics.newest_run(read_rows(str(path)))] == [5]


HEADER = ",".join(metrics.FIELDS) + "\n"


def test_values_beyond_float32_and_unknown_phases_are_left_out(tmp_path, capsys):
    """A 1e308 loss beside a finite one made matplotlib's tick maths a ValueError traceback; a
    phase of no colour drew an empty panel and a legend warning."""
    (tmp_path / "metrics.csv").write_text(HEADER + "1,0,1,train,loss,inf,0\n"
                                          "1,0,2,train,loss,1e308,0\n1,0,3,train,loss,2,0\n"
                                          "1,0,3,weird,loss,1,0\n1,0,4,train,loss,1,0\n")
    assert plot.main([str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out == (f"{tmp_path / 'curves.png'}: loss (train), steps 3 to "
                                         f"4; 3 rows left out ({plot.UNDRAWN})\n")
    assert png_size(tmp_path / "curves.png")[0] == plot.WIDTH


def test_more_metrics_than_panels_is_one_line_at_once(tmp_path, capsys):
    """3000 metrics were 1500 rows of panels: no figure within minutes."""
    (tmp_path / "metrics.csv").write_text(HEADER + "".join(f"1,0,1,train,m{i},1,0\n"
                                                           for i in range(3000)))
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"singa-plot: {tmp_path / 'metrics.csv'}: 3000 metrics; "
                                       f"singa-plot draws at most 32 (a panel each)\n")
    assert os.listdir(tmp_path) == ["metrics.csv"]


def test_the_png_is_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    write_metrics(tmp_path)
    (tmp_path / "curves.png").write_bytes(b"old")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", fail)
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == \
        f"singa-plot: cannot write {tmp_path / 'curves.png'}: No space left on device\n"
    assert (tmp_path / "curves.png").read_bytes() == b"old"
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]

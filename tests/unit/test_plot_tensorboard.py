"""singa.watch.tensorboard's EventWriter read back with TensorBoard's own reader, and the edges of
singa.watch.plot (bin/singa-plot.sh) that tests/unit/test_plot.py leaves out."""
import os
import subprocess
import sys

import pytest

import singa
from singa.watch import plot
from singa.watch.metrics import Reporter, read_rows
from singa.watch.tensorboard import EventWriter
from test_plot import png_size, run, write_metrics

HEADER = "job,group,step,phase,metric,value,wall_time\n"


def scalars_of(workspace, run=""):
    """{tag: [(step, value, wall_time)]} of the event files in `<workspace>/tensorboard/<run>`
    (the one run's folder when `run` is None)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    folder = os.path.join(str(workspace), "tensorboard", run if run is not None else "")
    if run is None:
        (folder,) = [e.path for e in os.scandir(folder)]
    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_event_files_hold_the_scalars_by_phase_metric_and_group(tmp_path):
    w = EventWriter.open(str(tmp_path), pytest.fail)
    w.scalars(0, 0, "train", {"loss": 2.5, "accuracy": 0.125}, 1700000000.25)
    w.scalars(0, 10, "train", {"loss": 1 / 3, "accuracy": 0.5}, 1700000010.5)
    w.scalars(0, 10, "validation", {"ppl": 123.456}, 1700000011.0)
    w.scalars(1, 10, "test", {"squared error": 0.1}, 1700000012.0)
    w.flush()
    w.close()
    got = scalars_of(tmp_path)
    assert sorted(got) == ["test/squared_error/group1", "train/accuracy", "train/loss",
                           "validation/ppl"]
    want = {"train/loss": [(0, 2.5, 1700000000.25), (10, 1 / 3, 1700000010.5)],
            "train/accuracy": [(0, 0.125, 1700000000.25), (10, 0.5, 1700000010.5)],
            "validation/ppl": [(10, 123.456, 1700000011.0)],
            "test/squared_error/group1": [(10, 0.1, 1700000012.0)]}
    for tag, points in want.items():
        assert [s for s, _, _ in got[tag]] == [s for s, _, _ in points]
        assert [v for _, v, _ in got[tag]] == pytest.approx([v for _, v, _ in points], rel=1e-6)
        assert [t for _, _, t in got[tag]] == pytest.approx([t for _, _, t in points], abs=1e-3)


def test_a_reporter_writes_each_metrics_csv_row_as_a_scalar(tmp_path):
    r = Reporter(str(tmp_path), 7)
    r.metrics(0, 0, "train", {"Loss": 1.5, "squared error": 0.25})
    r.metrics(0, 5, "test", {"accuracy": 0.75})
    r.close()
    rows = read_rows(str(tmp_path / "metrics.csv"))
    got = scalars_of(tmp_path, None)
    assert sorted(got) == ["test/accuracy", "train/loss", "train/squared_error"]
    for row in rows:
        (step, value, wall_time), = got[f"{row['phase']}/{row['metric'].replace(' ', '_')}"]
        assert (step, wall_time) == (row["step"], pytest.approx(row["wall_time"], abs=1e-3))
        assert value == pytest.approx(row["value"], rel=1e-6)


def home(tmp_path, monkeypatch, checkout):
    """singa.HOME at <tmp>/home: a checkout (pyproject.toml, .venv/bin/pip) or an installed
    package's folder; returns the pip command the hints should name."""
    path = tmp_path / "home"
    (path / ".venv" / "bin").mkdir(parents=True)
    if checkout:
        (path / "pyproject.toml").write_text("")
        (path / ".venv" / "bin" / "pip").write_text("")
    monkeypatch.setattr(singa, "HOME", str(path))
    return (lambda extra: f"{path}/.venv/bin/pip install -e '{path}[{extra}]'") if checkout \
        else (lambda extra: f"pip install 'singa[{extra}]'")


@pytest.mark.parametrize("checkout", [True, False])
def test_without_tensorboardx_open_is_none_after_one_log_line_naming_the_install(
        tmp_path, monkeypatch, checkout):
    install = home(tmp_path, monkeypatch, checkout)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    lines = []
    assert EventWriter.open(str(tmp_path), lines.append) is None
    assert lines == [f"TensorBoard event files need tensorboardX: {install('tensorboard')}"]
    assert not (tmp_path / "tensorboard").exists()


def test_processes_of_one_run_open_its_folder_together_and_a_failure_stops_nothing(
        tmp_path, monkeypatch):
    """Each worker group's first worker writes into the run's folder: another process making
    it between tensorboardX's check and its makedirs (the race Hogwild hit) is no error, and
    a folder that cannot be written is a log line and no events, never an exception."""
    import tensorboardX.record_writer as record_writer
    run = tmp_path / "tensorboard" / "run1"
    real_exists = os.path.exists
    monkeypatch.setattr(record_writer.os.path, "exists",    # the other process made it just now
                        lambda path: False if str(path) == str(run) else real_exists(path))
    lines = []
    assert EventWriter.open(str(tmp_path), lines.append, "run1") is None
    assert lines == [f"TensorBoard events off: cannot write {run}: File exists"]
    monkeypatch.undo()
    writer = EventWriter.open(str(tmp_path), lines.append, "run1")    # made already: no error
    assert writer is not None and len(lines) == 1
    writer.close()
    (tmp_path / "file").write_text("")
    lines = []
    assert EventWriter.open(str(tmp_path / "file"), lines.append, "run1") is None
    folder = tmp_path / "file" / "tensorboard" / "run1"
    assert lines == [f"TensorBoard events off: cannot write {folder}: Not a directory"]


@pytest.mark.parametrize("checkout", [True, False])
def test_without_matplotlib_the_plot_names_the_install(tmp_path, monkeypatch, capsys,
                                                        checkout):
    install = home(tmp_path, monkeypatch, checkout)
    write_metrics(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"singa-plot: singa-plot needs matplotlib: " \
                                      f"{install('plot')}\n"
    assert not (tmp_path / "curves.png").exists()


def test_job_0_any_extension_and_a_perplexity_without_positive_values(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        HEADER + "".join(f"0,0,{s},train,loss,{1 / (s + 1)},1\n0,0,{s},validation,ppl,0,1\n"
                         f"0,0,{s},test,squared error,{s},1\n0,1,{s},train,loss,9,1\n"
                         for s in (0, 10, 20)) + "3,0,30,train,loss,1,1\n")
    r = run(tmp_path, "-job", 0, "-o", tmp_path / "curves.txt")
    assert r.returncode == 0 and r.stderr == "", r.stderr        # no log-scale warning either
    assert png_size(tmp_path / "curves.txt") == (plot.WIDTH, 2 * plot.ROW_HEIGHT)
    assert r.stdout == (f"{tmp_path / 'curves.txt'}: loss, ppl, squared error (test, train, "
                        f"validation), steps 0 to 20\n")
    fig = plot.figure(read_rows(str(tmp_path / "metrics.csv"), 0), "t")
    assert fig.get_suptitle() == "t"
    scales = {ax.get_title(): ax.get_yscale() for ax in fig.axes if ax.get_visible()}
    assert scales == {"loss": "linear", "ppl": "linear", "squared error": "linear"}


@pytest.mark.parametrize("text, error", [
    (HEADER + "1,1,0,train,loss,1,1\n", "no rows of worker group 0"),
    (HEADER + "1,0,0,train,loss,1,1\n", "no rows of job 0"),
    ("", "no rows"),
    (HEADER + "1,0,0,train,lo\xff\n", "cannot read: "),
])
def test_unusable_metrics_is_one_line_and_exit_2(tmp_path, text, error):
    (tmp_path / "metrics.csv").write_bytes(text.encode("latin-1"))
    r = run(tmp_path, "-job", 0) if "job 0" in error else run(tmp_path)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"singa-plot: {tmp_path / 'metrics.csv'}: {error}")
    assert not (tmp_path / "curves.png").exists()


def test_the_script_says_where_python_is_missing(tmp_path):
    r = subprocess.run([os.path.join(singa.HOME, "bin", "singa-plot.sh"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHON=str(tmp_path / "nopython")))
    assert r.returncode == 1
    assert r.stderr == (f"singa: {tmp_path / 'nopython'} not found; run "
                        f"{singa.HOME}/thirdparty/install.sh\n")

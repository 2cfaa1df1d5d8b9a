"""What `bin/singa-plot.sh` runs: the curves of a workspace's metrics.csv as a PNG.

    python -m singa.watch.plot <workspace> [-o curves.png] [-job ID | -all]

One panel per metric (loss, accuracy, ppl, ...; at most MAX_METRICS), a line per phase
(train, validation, test) over the steps; perplexity on a log scale. The rows of the
workspace's newest run and of the runs it resumed (`metrics.newest_run`: an earlier fresh
run is left out), or of job `-job`, or of every job in the file with `-all`; where runs
repeat a step, the later row wins. Rows with nan, infinite or beyond-float32 values
(matplotlib cannot scale an axis to 1e308), negative steps or a phase other than train,
validation and test are left out and counted.
Matplotlib (the optional extra `singa[plot]`) draws headless (Agg).
"""
import csv
import math
import os
import sys

import numpy as np

from singa.errors import ArgumentParser, SingaError
from singa.files import write_atomic
from singa.job import workspace
from singa.watch import metrics
from singa.watch.tensorboard import pip_install

#: pixels: the figure is WIDTH wide and ROW_HEIGHT per row of two panels
WIDTH, ROW_HEIGHT, DPI = 1200, 400, 100
LOG_SCALE = ("ppl", "perplexity")
COLORS = {"train": "tab:blue", "validation": "tab:orange", "test": "tab:green"}
#: the most metrics drawn (a panel each: the figure grows by ROW_HEIGHT per two)
MAX_METRICS = 32
LARGEST = float(np.finfo(np.float32).max)

UNDRAWN = "nan, infinite or beyond-float32 values, negative steps, unknown phases"


def drawable(rows):
    """(the rows of a phase of metrics.PHASES with a value within float32's range and a step
    >= 0, how many others there were)."""
    kept = [r for r in rows if abs(r["value"]) <= LARGEST and r["step"] >= 0
            and r["phase"] in metrics.PHASES]
    return kept, len(rows) - len(kept)


def curves(rows):
    """{metric: {phase: [(step, value)] by step}} of metrics.csv rows (group 0), the later row
    winning for a repeated (metric, phase, step)."""
    points = {}
    for row in rows:
        if row["group"] == 0:
            points.setdefault(row["metric"], {}).setdefault(row["phase"], {})[row["step"]] = \
                row["value"]
    return {name: {phase: sorted(steps.items()) for phase, steps in by_phase.items()}
            for name, by_phase in points.items()}


def figure(rows, title):
    """The matplotlib Figure of `rows` (see `curves`): panels in pairs per row."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    data = curves(rows)
    names = sorted(data, key=lambda n: (n != "loss", n))
    nrows = math.ceil(len(names) / 2)
    fig = Figure(figsize=(WIDTH / DPI, ROW_HEIGHT * nrows / DPI), dpi=DPI)
    axes = fig.subplots(nrows, 2, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        for phase in metrics.PHASES:
            if phase in data[name]:
                steps, values = zip(*data[name][phase])
                ax.plot(steps, values, label=phase, color=COLORS[phase],
                        marker="o" if phase != "train" else None, markersize=3)
        if name in LOG_SCALE and any(v > 0 for line in data[name].values() for _, v in line):
            ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = ArgumentParser(prog="singa-plot", description="Draw a workspace's training "
                        "curves (metrics.csv) as a PNG.")
    ap.add_argument("workspace")
    ap.add_argument("-o", dest="out", help="the PNG to write (default <workspace>/curves.png)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("-job", type=int, help="only the rows of this job id")
    which.add_argument("-all", action="store_true", help="the rows of every run in the file "
                       "(default: the newest run and the runs it resumed)")
    try:
        args = ap.parse_args(argv)
        path = os.path.join(args.workspace, workspace.METRICS)
        if not os.path.isfile(path):
            raise SingaError(f"{path}: no metrics file (a job writes it in its workspace)")
        try:
            rows = metrics.read_rows(path, args.job)
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise SingaError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        of_job = f" of job {args.job}" if args.job is not None else ""
        if not rows:
            raise SingaError(f"{path}: no rows{of_job}")
        total = len(rows)
        rows, dropped = drawable(rows)
        if not rows:
            raise SingaError(f"{path}: none of its {total} rows{of_job} can be drawn ({UNDRAWN})")
        if args.job is None and not args.all:
            rows = metrics.newest_run(rows)
        rows = [r for r in rows if r["group"] == 0]       # the curves are worker group 0's
        if not rows:
            raise SingaError(f"{path}: no rows of worker group 0{of_job}")
        names = {r["metric"] for r in rows}
        if len(names) > MAX_METRICS:
            raise SingaError(f"{path}: {len(names)} metrics; singa-plot draws at most "
                             f"{MAX_METRICS} (a panel each)")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SingaError(f"singa-plot needs matplotlib: {pip_install('plot')}") from None
        out = args.out or os.path.join(args.workspace, workspace.CURVES)
        title = os.path.abspath(args.workspace) + (f" (job {args.job})" if of_job else "")
        fig = figure(rows, title)
        try:
            write_atomic(out, lambda f: fig.savefig(f, format="png"))
        except OSError as e:
            raise SingaError(f"cannot write {out}: {e.strerror or e}") from None
    except SingaError as e:
        print(f"singa-plot: {e}", file=sys.stderr)
        return e.exit_code
    data = curves(rows)
    steps = [r["step"] for r in rows]
    phases = sorted({p for by_phase in data.values() for p in by_phase})
    left_out = f"; {dropped} rows left out ({UNDRAWN})" if dropped else ""
    print(f"{out}: {', '.join(sorted(data))} ({', '.join(phases)}), steps {min(steps)} to "
          f"{max(steps)}{left_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""From a cold process to a trained first step: the Python API in-process (`import singa.model`,
`Model.from_conf(conf).fit(nb_epoch=1)`: no ZooKeeper) against `bin/singa-run.sh -conf conf`
(a job id from ZooKeeper, the driver process, its membership znodes). Whole processes, wall
time, in interleaved rounds; SINGA's fixture MLP (784-64-10), one train step, no test.

    .venv/bin/python bench/bench_startup.py [--rounds 7]

singa-run.sh starts the local ZooKeeper of conf/singa.conf if none answers (the first, untimed
round); it is left running.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(HOME, "tests", "fixtures", "singa-0.3")
API = ("import sys\nfrom singa.model import Model\n"
       "Model.from_conf(sys.argv[1]).fit(nb_epoch=1, progress=False)\n")


def fixture_job(folder, replacements):
    """The fixture MLP's job.conf with each (old, new) of `replacements` made (each must
    occur; its workspace and data paths always), written to <folder>/job.conf: its path."""
    with open(os.path.join(FIXTURES, "job.conf")) as f:
        text = f.read()
    for old, new in tuple(replacements) + (
            ("/tmp/singa-fixture-ws", os.path.join(folder, "ws")),
            ('"tests/fixtures/singa-0.3/', f'"{FIXTURES}/')):
        assert old in text, old
        text = text.replace(old, new)
    path = os.path.join(folder, "job.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def job_conf(folder):
    return fixture_job(folder, (("train_steps: 200", "train_steps: 1"),
                                ("test_steps: 5", "test_steps: 0")))


def timed(cmd):
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=HOME, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        conf = job_conf(folder)
        sides = {"python API, in-process": [sys.executable, "-c", API, conf],
                 "bin/singa-run.sh": [os.path.join(HOME, "bin", "singa-run.sh"), "-conf", conf]}
        for cmd in sides.values():      # warm-up: page cache, ZooKeeper started
            timed(cmd)
        times = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, cmd in sides.items():
                times[name].append(timed(cmd))
                time.sleep(0.2)
    api, cli = (statistics.median(t) for t in times.values())
    print(f"{'start to first step done, process exit':40s} {'median s':>9s} {'min':>7s} {'max':>7s}")
    for name, t in times.items():
        print(f"{name:40s} {statistics.median(t):9.3f} {min(t):7.3f} {max(t):7.3f}")
    print(f"in-process / singa-run.sh: {api / cli:.2f}")


if __name__ == "__main__":
    main()

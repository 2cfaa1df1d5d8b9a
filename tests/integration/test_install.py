"""singa as a library: `pip install` of a copy of the source, or of the wheel built from it,
into a fresh venv in a temporary directory, then a `fit` run there on numpy data with a
relative workspace (resolved against the current directory), reading nothing of this
repository. And thirdparty/install.sh's choice of extras for a job and for the tests."""
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import singa

FIT = """
import json, sys
opened = []
sys.addaudithook(lambda event, args: event == "open" and isinstance(args[0], str)
                 and args[0].startswith(sys.argv[1]) and opened.append(args[0]))
import numpy as np
import singa
from singa.model import SGD, Cluster, Dense, Sequential
rng = np.random.default_rng(0)
y = rng.integers(0, 3, 600)
x = (rng.normal(0, 3, (3, 20))[y] + rng.normal(0, 1, (600, 20))).astype(np.float32)
m = Sequential("blobs")
m.add(Dense(16, activation="tanh"))
m.add(Dense(3, activation="softmax"))
m.compile(loss="categorical_crossentropy", optimizer=SGD(lr=0.1, momentum=0.9),
          cluster=Cluster("ws"))
h = m.fit(x, y, batch_size=50, nb_epoch=60, progress=False, seed=1)
print(json.dumps({"singa": singa.__file__, "snapshot": m.last_checkpoint_path,
                  "accuracy": float(np.mean(m.predict(x).argmax(1) == y)), "opened": opened,
                  "loss": [h["train"][0][1]["loss"], h["train"][-1][1]["loss"]]}))
"""


@pytest.mark.parametrize("what", ["source", "wheel"])
def test_pip_install_into_a_fresh_venv_then_fit_there(tmp_path, what):
    """`pip install .` (a copy of the source) or of the wheel built from it."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(singa.HOME, "singa"), src / "singa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(singa.HOME, "pyproject.toml"), src)
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr
    (built,) = (tmp_path / "dist").iterdir()
    names = zipfile.ZipFile(built).namelist()
    assert {"singa/model.py", "singa/proto/job_pb2.py", "singa/layers/__init__.py",
            "singa/layers/kernels/cuda.cu", "singa/train/updater_cuda.cu"} <= set(names)

    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          str(src if what == "source" else built)], capture_output=True,
                         text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([python, "-c", FIT, singa.HOME], cwd=work, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["singa"].startswith(str(venv))
    assert out["opened"] == []                       # nothing of the repository was read
    assert out["snapshot"] == str(work / "ws" / "checkpoint" / "step60-worker0.bin")
    assert os.path.isfile(out["snapshot"]) and (work / "ws" / "blobs.log").is_file()
    assert out["loss"][1] < out["loss"][0] / 10 and out["accuracy"] > 0.95, out


FAKE_PYTHON = """#!/usr/bin/env bash
# the venv's python, standing in for pip: logs its arguments
printf '%s\\n' "$*" >> {log}
"""
# what install.sh would otherwise apt-get install (a machine tests/run.sh has installed)
DEBIAN = ["/usr/share/java/zookeeper.jar", "/usr/sbin/sshd"]
COMMANDS = ["java", "ip", "slurmctld", "slurmd", "munged", "srun"]


def test_install_sh_gives_a_job_its_extras_and_the_tests_theirs_in_either_order(tmp_path):
    """thirdparty/install.sh (a copy, its venv's python a stand-in that logs pip's arguments):
    the main job's install asks for the extras a job uses (fast, plot, tensorboard), --tests
    adds `test`; run after the other, either one installs only what is missing (the main job's
    after --tests: nothing), a changed pyproject.toml reinstalls every extra installed so far,
    and a venv of an older install.sh (its stamp empty, `test` installed) needs nothing."""
    if not all(os.path.exists(f) for f in DEBIAN) or not all(map(shutil.which, COMMANDS)) or \
            not glob.glob("/usr/share/datasets/fashion-mnist/*.gz"):
        pytest.skip("install.sh would apt-get install Debian packages here (tests/run.sh "
                    "installs them first)")

    def home(name):
        path = tmp_path / name
        (path / "thirdparty").mkdir(parents=True)
        shutil.copy(os.path.join(singa.HOME, "thirdparty", "install.sh"), path / "thirdparty")
        shutil.copy(os.path.join(singa.HOME, "pyproject.toml"), path)
        os.utime(path / "pyproject.toml", (1e9, 1e9))        # older than any stamp
        python = path / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(FAKE_PYTHON.format(log=path / "pip.log"))
        python.chmod(0o755)
        (path / "pip.log").touch()
        return path

    def install(path, *flags):
        """The pip command install.sh ran ("" when none) and the venv's stamp after it."""
        before = (path / "pip.log").read_text()
        r = subprocess.run([str(path / "thirdparty" / "install.sh"), *flags], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        pip = (path / "pip.log").read_text()[len(before):].strip()
        if pip:
            assert f"install: pip install -e {path}[" in r.stdout, r.stdout
        return pip, (path / ".venv" / ".singa-installed").read_text().strip()

    pip = "-m pip install --disable-pip-version-check -e {}[{}]"
    job, tests = "fast,plot,tensorboard", "fast,plot,tensorboard,test"
    first = home("job-first")
    assert install(first) == (pip.format(first, job), job)
    assert install(first, "--tests") == (pip.format(first, tests), tests)
    assert install(first) == ("", tests)
    assert install(first, "--tests") == ("", tests)
    (first / "pyproject.toml").touch()                        # a changed pyproject.toml
    assert install(first) == (pip.format(first, tests), tests)

    other = home("tests-first")
    assert install(other, "--tests") == (pip.format(other, tests), tests)
    assert install(other) == ("", tests)

    older = home("older")
    (older / ".venv" / ".singa-installed").touch()
    assert install(older) == ("", "")
    assert install(older, "--tests") == ("", "")

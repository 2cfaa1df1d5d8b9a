"""SINGA's example confs as Python API models for tests that train them on two devices
(tests/gpu on a GPU, tests/integration on the CuPy stand-in)."""
import os
import subprocess
import sys

import singa
from singa import checkpoint
from singa.model import Model

EXAMPLES = os.path.join(singa.HOME, "examples")


def conf_model(tmp_path, name, path, replacements):
    """Model.from_conf of the conf at `path` with each `old` replaced by `new` (each must
    occur), its workspace <tmp_path>/<name>."""
    with open(path) as f:
        text = f.read()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    conf = tmp_path / f"{name}.conf"
    conf.write_text(text)
    m = Model.from_conf(str(conf))
    m.jobconf.cluster.workspace = str(tmp_path / name)
    return m


def final_params(m):
    """{name: values} of the snapshot the model's last run ended with."""
    r = checkpoint.CheckpointReader(m.last_checkpoint_path)
    return {name: r.param(name) for name in r.names}


def on_cpu_and_gpu(make, **fit):
    """{"cpu": final params, "gpu": final params} of `make(name)`'s model trained by
    `fit(**fit)` on the CPU and on GPU 0."""
    runs = {}
    for name, device in (("cpu", None), ("gpu", [0])):
        m = make(name)
        m.fit(progress=False, device=device, **fit)
        runs[name] = final_params(m)
    return runs


def char_rnn_data(tmp_path):
    """char-rnn's input.txt and vocab.txt in `tmp_path`, from the ASCII of this README (a text
    of fewer than the confs' 101 distinct bytes on any machine)."""
    text = tmp_path / "text.txt"
    with open(os.path.join(singa.HOME, "README.md"), "rb") as f:
        text.write_bytes(f.read().decode().encode("ascii", "ignore") * 4)
    made = subprocess.run([sys.executable, f"{EXAMPLES}/char-rnn/create_data.py", "--text",
                           str(text), "--out-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr


def char_rnn_model(tmp_path, name):
    """SINGA's char-rnn conf with GRUs of 32 unrolled 5 steps, on `char_rnn_data(tmp_path)`."""
    return conf_model(tmp_path, name, f"{EXAMPLES}/char-rnn/job.conf", {
        "dim_hidden: 512": "dim_hidden: 32", "unroll_len: 50": "unroll_len: 5",
        "examples/char-rnn/input.txt": f"{tmp_path}/input.txt",
        "examples/char-rnn/vocab.txt": f"{tmp_path}/vocab.txt"})

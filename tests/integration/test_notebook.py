"""examples/notebooks/mnist.ipynb, executed headless by a real Jupyter kernel (nbclient and
ipykernel): it trains in the kernel, shows a History, evaluates, predicts and trains on from
its snapshot, and nothing but the progress bar and its own prints reaches the notebook."""
import ast
import os
import re
import shutil

import nbclient
import nbformat

import singa

NOTEBOOK = os.path.join(singa.HOME, "examples", "notebooks", "mnist.ipynb")


def text_of(output):
    return output.get("text") or output.get("data", {}).get("text/plain", "")


def test_mnist_notebook_runs_in_a_real_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", singa.HOME)    # the kernel imports this checkout's package
    shutil.copy(NOTEBOOK, tmp_path / "mnist.ipynb")
    nb = nbformat.read(tmp_path / "mnist.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    outputs = [o for cell in cells for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    streams = "".join(text_of(o) for o in outputs if o.output_type == "stream")
    # no log lines, warnings or tracebacks: the log is in the workspace
    assert not re.search(r"(?m)^[IWEF]\d{4} |Train @ step|Warning|Traceback", streams), streams
    assert "fashion-mlp: 100%" in streams             # the progress bar (text without ipywidgets)
    tests = [float(a) for a in re.findall(r"Test @ step \d+  loss = [\d.]+, accuracy = ([\d.]+)",
                                          streams)]
    assert len(tests) == 4 and tests[0] < 0.3 and tests[-1] > 0.75, tests
    evaluated = ast.literal_eval(text_of(cells[3].outputs[-1]))
    assert set(evaluated) == {"loss", "accuracy"} and evaluated["accuracy"] > 0.75
    predicted = re.findall(r"array\(\[([\d, ]+)\]", text_of(cells[4].outputs[-1]))
    guess, truth = ([int(v) for v in group.split(",")] for group in predicted)
    assert sum(g == t for g, t in zip(guess, truth)) >= 7, (guess, truth)
    summary = ast.literal_eval(text_of(cells[5].outputs[-1]))
    assert summary["first_train_step"] == 300                # fit twice: resumed at step 300
    assert summary["resumed_test"][0] == 500 and summary["resumed_test"][1]["accuracy"] > 0.75
    assert summary["last_snapshot"] == str(tmp_path / "workspace" / "checkpoint" /
                                           "step500-worker0.bin")
    assert (tmp_path / "workspace" / "fashion-mlp.log").is_file()

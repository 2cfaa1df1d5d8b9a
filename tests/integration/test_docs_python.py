"""docs/python.md runs as written: its ```python blocks, in order, are the cells of one notebook
executed by a real Jupyter kernel (nbclient, ipykernel) from a folder that holds
examples/mnist/ (job.conf and the shards), and they do what the doc says they do."""
import json
import os
import re
import shutil

import nbclient
import nbformat
import pytest

import singa

DOC = os.path.join(singa.HOME, "docs", "python.md")

#: cells run after the doc's block that holds the key: they keep a doc variable that later
#: blocks reuse (m, h) under a name of its own, for PROBE
KEEP = {"stop.stopped_step": "h_callbacks = h",
        "checkpoint_path='best')": "best = _",
        "m.save('fashion-model')": "saved = m",
        "k.evaluate(chunks(x_test, y_test))": "h_stream = h",
        "h['test'][-1]": "h_first = h",
        "h.history['val_accuracy']": "h_keras = h"}

#: run after the doc's cells, in its kernel: facts of the doc's own variables
PROBE = """\
import json, os
from singa.io.store import count_records
validations = h_callbacks["validation"]
best_accuracy = max(v["accuracy"] for _, v in validations)
print(json.dumps({
    "stopped_step": stop.stopped_step,
    "validated_at": [s for s, _ in validations],
    "last_snapshot": h_callbacks.snapshots[-1][0],
    "best_steps": [s for s, v in validations if v["accuracy"] == best_accuracy],
    "best_accuracy": best_accuracy,
    "best_evaluated": best["accuracy"],
    "loaded_predicts_as_saved": bool(np.array_equal(load_model("fashion-model").predict(x_test),
                                                    saved.predict(x_test))),
    "stream_file": os.path.isfile("keras/data/train-stream.bin"),
    "stream_snapshot": h_stream.snapshots[-1][0],
    "records": count_records("kvfile", "fashion-train.bin"),
    "first_test": h_first["test"][-1],
    "keras_val_accuracy": h_keras.history["val_accuracy"],
    "keras_validated_at": [s for s, _ in h_keras["validation"]],
    "last_validation": validations[-1],
}))
"""


def python_blocks(text):
    """The bodies of the ```python fences of a markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)


def text_of(output):
    return output.get("text") or output.get("data", {}).get("text/plain", "")


def test_every_python_block_of_the_doc_runs_in_order_in_a_real_kernel(tmp_path, monkeypatch,
                                                                    mnist_data):
    folder = tmp_path / "examples" / "mnist"
    folder.mkdir(parents=True)
    for name in ("train_data.bin", "test_data.bin"):
        os.symlink(os.path.join(mnist_data, name), folder / name)
    shutil.copy(os.path.join(mnist_data, "job.conf"), folder)
    monkeypatch.setenv("PYTHONPATH", singa.HOME)    # the kernel imports this checkout's package
    with open(DOC) as f:
        blocks = python_blocks(f.read())
    assert len(blocks) >= 10, "the doc's ```python blocks were not found"
    cells = []
    for block in blocks:
        cells.append(nbformat.v4.new_code_cell(block))
        cells += [nbformat.v4.new_code_cell(line) for key, line in KEEP.items() if key in block]
    assert len(cells) == len(blocks) + len(KEEP), "a block PROBE reads has changed"
    nb = nbformat.v4.new_notebook(cells=cells + [nbformat.v4.new_code_cell(PROBE)])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells for o in cell.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors
    streams = "".join(text_of(o) for o in outputs if o.output_type == "stream")
    # no log lines, warnings or tracebacks: the log is in the workspaces
    assert not re.search(r"(?m)^[IWEF]\d{4} |^singa: |Traceback", streams), streams

    # evaluate prints one line: 10 batches of a Data layer (SINGA's test_steps), every sample
    # of numpy data and of an iterable of batches
    evaluated = re.findall(r"Test @ step (\d+) on (\d+) (batches|samples):  loss = ([\d.]+), "
                           r"accuracy = ([\d.]+)", streams)
    assert [e[:3] for e in evaluated] == [("30", "10", "batches"), ("300", "10000", "samples"),
                                          ("314", "10000", "samples"),
                                          (evaluated[3][0], "2000", "samples"),
                                          ("627", "10000", "samples")], evaluated
    assert all(float(acc) > 0.75 for *_, acc in evaluated[1:]), evaluated
    # the figures the doc quotes in its comments are those the blocks print
    with open(DOC) as f:
        quoted = re.findall(r"# Test @ step (\d+) on (\d+) (batches|samples):  loss = "
                            r"([\d.]+)\.\.\., accuracy = ([\d.]+)", f.read())
    assert len(quoted) >= 4, quoted
    printed = {e[:3]: e[3:] for e in evaluated}
    for *key, loss, accuracy in quoted:
        assert tuple(key) in printed, (key, evaluated)
        got_loss, got_accuracy = printed[tuple(key)]
        assert got_loss.startswith(loss), (key, loss, got_loss)
        assert round(float(got_accuracy), len(accuracy) - 2) == float(accuracy), \
            (key, accuracy, got_accuracy)
    assert re.search(r"Loss = [\d.]+, accuracy = [\d.]+", streams)   # the layers' display()

    facts = json.loads(text_of(nb.cells[-1].outputs[-1]))
    # EarlyStopping stopped the 2000 steps at a validation, then a snapshot a step or two later
    assert facts["stopped_step"] == facts["validated_at"][-1] < 2000, facts
    assert facts["stopped_step"] <= facts["last_snapshot"] <= facts["stopped_step"] + 3, facts
    # ModelCheckpoint kept the best snapshot, and evaluate(checkpoint_path='best') scored it
    assert facts["best_evaluated"] == pytest.approx(facts["best_accuracy"], abs=1e-12), facts
    assert int(evaluated[3][0]) in facts["best_steps"], (evaluated, facts)
    # the doc's comments quote these
    doc = open(DOC).read()
    step, loss, acc = re.search(r"# \((\d+), \{'loss': ([\d.]+)\.\.\., 'accuracy': ([\d.]+)\}\)",
                                doc).groups()
    assert facts["first_test"][0] == int(step) and \
        str(facts["first_test"][1]["loss"]).startswith(loss) and \
        round(facts["first_test"][1]["accuracy"], len(acc) - 2) == float(acc), facts
    accs, at = re.search(r"# \[([\d., ]+)\]: steps (\d+ and \d+)", doc).groups()
    assert [round(a, 4) for a in facts["keras_val_accuracy"]] == \
        [float(a) for a in accs.split(", ")], facts
    assert facts["keras_validated_at"] == [int(a) for a in at.split(" and ")], facts
    stopped, vstep, loss, acc = re.search(
        r"# \((\d+), \((\d+), \{'loss': ([\d.]+)\.\.\., 'accuracy': ([\d.]+)\}\)\)", doc).groups()
    assert facts["stopped_step"] == int(stopped) and facts["last_validation"][0] == int(vstep)
    assert str(facts["last_validation"][1]["loss"]).startswith(loss) and \
        round(facts["last_validation"][1]["accuracy"], len(acc) - 2) == float(acc), facts
    assert f"(step {facts['last_snapshot']} above)" in doc, facts
    # load_model's predictions are those of the model saved
    assert facts["loaded_predicts_as_saved"]
    # the generator went to a kvfile once, and the second fit went on from step 314
    assert facts["stream_file"] and facts["stream_snapshot"] == 627, facts
    assert facts["records"] == 60000

"""A Caffe train_val.prototxt whose data layers read Caffe's data as it is (an LMDB written by
Caffe's convert_imageset, an ImageData list): bin/singa-import.sh caffe, then the job trains
and tests as written, through the singa driver (tests/fixtures/caffe/data)."""
import os
import re
import subprocess

import pytest

import singa

pytest.importorskip("lmdb")
pytest.importorskip("PIL")

DATA = os.path.join(singa.HOME, "tests", "fixtures", "caffe", "data")
IMPORT = os.path.join(singa.HOME, "bin", "singa-import.sh")

TRANSFORM = ("transform_param { scale: 0.017 mean_value: 104 mean_value: 117 mean_value: 123 "
             "crop_size: 5 mirror: %s }")
SOURCES = {
    "lmdb": ('type: "Data" data_param {{ source: "{DATA}/raw_lmdb" backend: LMDB '
             'batch_size: 2 }}',
             'type: "Data" data_param {{ source: "{DATA}/encoded_lmdb" backend: LMDB '
             'batch_size: 4 }}'),
    "imagelist": ('type: "ImageData" image_data_param {{ source: "{DATA}/list.txt" '
                  'root_folder: "{DATA}/images/" batch_size: 2 shuffle: true '
                  'new_height: 6 new_width: 8 }}',
                  'type: "ImageData" image_data_param {{ source: "{DATA}/list.txt" '
                  'root_folder: "{DATA}/images/" batch_size: 4 new_height: 6 new_width: 8 }}'),
}


def train_val(kind):
    train, test = (s.format(DATA=DATA) for s in SOURCES[kind])
    return f"""name: "tiny"
layer {{ name: "data" top: "data" top: "label" include {{ phase: TRAIN }}
  {TRANSFORM % "true"} {train} }}
layer {{ name: "data" top: "data" top: "label" include {{ phase: TEST }}
  {TRANSFORM % "false"} {test} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 2 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
  include {{ phase: TEST }} }}
"""


SOLVER = """net: "train_val.prototxt"
test_iter: 1
test_interval: 3
base_lr: 0.01
lr_policy: "fixed"
momentum: 0.9
max_iter: 6
display: 3
snapshot: 3
snapshot_prefix: "tiny"
"""


@pytest.mark.parametrize("kind", ["lmdb", "imagelist"])
def test_imported_train_val_trains_on_caffes_data(tmp_path, run_driver, kind):
    caffe = tmp_path / "caffe"
    caffe.mkdir()
    (caffe / "train_val.prototxt").write_text(train_val(kind))
    (caffe / "solver.prototxt").write_text(SOLVER)
    out = tmp_path / "job"
    r = subprocess.run([IMPORT, "caffe", str(caffe / "solver.prototxt"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"reads the {kind}" in r.stdout
    r = run_driver(out / "job.conf")
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"Train @ step \d+ +Loss = [0-9.]+, accuracy", r.stderr)) == 2
    assert r.stderr.count("Test @ step") == 2
    assert (out / "checkpoint" / "step6-worker0.bin").exists()
    r = run_driver(out / "job.conf", "-resume")           # nothing left to train: resumes at 6
    assert r.returncode == 0, r.stderr

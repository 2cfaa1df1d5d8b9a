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


SMALL_FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")


def small_job(name, layers):
    """A kBP job (SGD with momentum) named `name` whose net is an input layer "data" (MNIST's
    1 × 28 × 28 images, batch 20, from the kvfile at DATA) and then `layers` (text format),
    workspace WS: `fitted` fills both in."""
    return f"""name: "{name}"
train_one_batch {{ alg: kBP }}
updater {{ type: kSGD momentum: 0.9 learning_rate {{ type: kFixed base_lr: 0.05 }} }}
neuralnet {{
  layer {{ name: "data" type: kRecordInput
    store_conf {{ backend: "kvfile" path: "DATA" batchsize: 20 std_value: 255
                 shape: 1 shape: 28 shape: 28 }} }}
{layers}
}}
cluster {{ workspace: "WS" }}
"""


def fitted(tmp_path, name, job, nb_epoch=8, device=None):
    """(history, final params) of `job` (DATA: MNIST's train-1000.bin) fitted `nb_epoch` steps
    (a display every 2, seed 3) on `device`, its workspace <tmp_path>/<name>."""
    conf = tmp_path / f"{name}.job.conf"
    conf.write_text(job.replace("DATA", f"{SMALL_FIXTURES}/train-1000.bin")
                    .replace("WS", str(tmp_path)))
    m = conf_model(tmp_path, name, str(conf), {})
    h = m.fit(nb_epoch=nb_epoch, disp_freq=2, seed=3, progress=False, device=device)
    return h.history, final_params(m)


#: small nets of the kinds SINGA's examples and the model zoo have
BRANCHED_JOB = small_job("branched", """  layer { name: "conv" type: kConvolution srclayers: "data"
    convolution_conf { num_filters: 4 kernel: 5 stride: 2 }
    param { name: "w0" init { type: kGaussian std: 0.1 } }
    param { name: "b0" init { type: kConstant value: 0 } } }
  layer { name: "bm" type: kCudnnBM srclayers: "conv"
    param { name: "s" init { type: kConstant value: 1 } }
    param { name: "t" init { type: kConstant value: 0 } }
    param { name: "m" init { type: kConstant value: 0 } }
    param { name: "v" init { type: kConstant value: 0 } } }
  layer { name: "relu" type: kReLU srclayers: "bm" }
  layer { name: "split" type: kSplit srclayers: "relu" split_conf { num_splits: 2 } }
  layer { name: "a" type: kConvolution srclayers: "split"
    convolution_conf { num_filters: 3 kernel: 3 pad: 1 }
    param { name: "wa" init { type: kGaussian std: 0.1 } }
    param { name: "ba" init { type: kConstant value: 0 } } }
  layer { name: "b" type: kPooling srclayers: "split"
    pooling_conf { pool: AVG kernel: 1 stride: 1 } }
  layer { name: "join" type: kConcate srclayers: "a" srclayers: "b"
    concate_conf { concate_dim: 1 } }
  layer { name: "ip" type: kInnerProduct srclayers: "join" innerproduct_conf { num_output: 10 }
    param { name: "w1" init { type: kGaussian std: 0.05 } }
    param { name: "b1" init { type: kConstant value: 0 } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }""")

RESIDUAL_JOB = small_job("residual", """  layer { name: "conv" type: kConvolution srclayers: "data"
    convolution_conf { num_filters: 4 kernel: 3 pad: 1 stride: 2 }
    param { name: "w0" init { type: kGaussian std: 0.1 } } }
  layer { name: "bn" type: kCaffeBatchNorm srclayers: "conv"
    batch_norm_conf { moving_average_fraction: 0.9 }
    param { name: "m0" } param { name: "v0" } param { name: "f0" } }
  layer { name: "scale" type: kScale srclayers: "bn" scale_conf { bias_term: true }
    param { name: "g0" init { type: kConstant value: 1 } }
    param { name: "t0" init { type: kConstant value: 0 } } }
  layer { name: "relu" type: kReLU srclayers: "scale" }
  layer { name: "split" type: kSplit srclayers: "relu" split_conf { num_splits: 2 } }
  layer { name: "branch" type: kConvolution srclayers: "split"
    convolution_conf { num_filters: 4 kernel: 3 pad: 1 }
    param { name: "w1" init { type: kGaussian std: 0.1 } } }
  layer { name: "bn1" type: kCaffeBatchNorm srclayers: "branch"
    param { name: "m1" } param { name: "v1" } param { name: "f1" } }
  layer { name: "scale1" type: kScale srclayers: "bn1"
    param { name: "g1" init { type: kConstant value: 1 } } }
  layer { name: "sum" type: kEltwise srclayers: "scale1" srclayers: "split"
    eltwise_conf { operation: SUM coeff: 1 coeff: 0.5 } }
  layer { name: "split2" type: kSplit srclayers: "sum" split_conf { num_splits: 2 } }
  layer { name: "pool" type: kPooling srclayers: "split2"
    pooling_conf { pool: MAX kernel: 2 stride: 2 } }
  layer { name: "crop" type: kCrop srclayers: "split2" srclayers: "pool"
    crop_conf { offset: 3 } }
  layer { name: "flat" type: kFlatten srclayers: "crop" }
  layer { name: "ip" type: kInnerProduct srclayers: "flat" innerproduct_conf { num_output: 10 }
    param { name: "w2" init { type: kGaussian std: 0.05 } }
    param { name: "b2" init { type: kConstant value: 0 } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }""")


CAFFE_DATA = os.path.join(singa.HOME, "tests", "fixtures", "caffe", "data")

#: Caffe's LMDB of PNG and JPEG Datums (four of 3 × 7 × 9, convert_imageset's) in batches of
#: 3, cropped to 5 × 5, mirrored and scaled by ImagePreprocess, as `singa-import caffe` writes
#: a Data layer's transform_param
FED_JOB = f"""name: "fed"
train_one_batch {{ alg: kBP }}
updater {{ type: kSGD momentum: 0.9 learning_rate {{ type: kFixed base_lr: 0.05 }} }}
neuralnet {{
  layer {{ name: "data" type: kRecordInput
    store_conf {{ backend: "lmdb" path: "{CAFFE_DATA}/encoded_lmdb" batchsize: 3
                 mean_value: 117 std_value: 2 }} }}
  layer {{ name: "pre" type: kImagePreprocess srclayers: "data"
    rgbimage_conf {{ cropsize: 5 mirror: true scale: 0.017 }} }}
  layer {{ name: "ip" type: kInnerProduct srclayers: "pre" innerproduct_conf {{ num_output: 2 }}
    param {{ name: "w" init {{ type: kGaussian std: 0.1 }} }}
    param {{ name: "b" init {{ type: kConstant value: 0 }} }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }}
}}
cluster {{ workspace: "WS" }}
"""


def fed(tmp_path, name, monkeypatch, steps=8, device=None):
    """(each training step's crops, host arrays; history; final params) of FED_JOB `fitted`
    `steps` steps on `device`."""
    from singa.device import host
    from singa.layers.input import ImagePreprocessLayer
    from singa.proto import job_pb2
    crops = []
    transform = ImagePreprocessLayer.transform

    def keep(self, flag, x):
        transform(self, flag, x)
        if flag & job_pb2.kTrain:
            crops.append(host(self.data).copy())
    with monkeypatch.context() as patch:
        patch.setattr(ImagePreprocessLayer, "transform", keep)
        history, params = fitted(tmp_path, name, FED_JOB, steps, device)
    return crops, history, params

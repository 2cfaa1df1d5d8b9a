"""What the conf tests share: a good job conf and the check that a bad one fails in one line
`file:line: what`."""
import pytest

from singa.errors import ConfigError
from singa.job import config

GOOD = """\
name: "t"
train_steps: 10
test_steps: 2
train_one_batch {
  alg: kBP
}
updater {
  type: kSGD
  learning_rate {
    type: kFixed
    base_lr: 0.1
  }
}
neuralnet {
  layer {
    name: "data"
    type: kRecordInput
    store_conf {
      path: "TRAIN"
      batchsize: 4
    }
    include: kTrain
  }
  layer {
    name: "data"
    type: kRecordInput
    store_conf {
      path: "TEST"
      batchsize: 4
    }
    include: kTest
  }
  layer {
    name: "fc"
    type: kInnerProduct
    srclayers: "data"
    innerproduct_conf {
      num_output: 2
    }
    param {
      name: "w"
    }
    param {
      name: "b"
    }
  }
  layer {
    name: "loss"
    type: kSoftmaxLoss
    srclayers: "fc"
    srclayers: "data"
  }
}
cluster {
  workspace: "WS"
}
"""


def line_of(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def write_conf(tmp_path, text):
    """Write `text` with real data files and workspace into tmp_path; return its path."""
    for name in ("train.bin", "test.bin"):
        (tmp_path / name).write_bytes(b"")
    text = (text.replace("TRAIN", str(tmp_path / "train.bin"))
            .replace("TEST", str(tmp_path / "test.bin"))
            .replace('"WS"', f'"{tmp_path / "ws"}"'))
    path = tmp_path / "job.conf"
    path.write_text(text)
    return path


def load_error(tmp_path, text, **kw):
    path = write_conf(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        config.load_job(str(path), **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg, str(path)


def expect_error(tmp_path, text, needle, what, **kw):
    """`text` fails at the line holding `needle` with a message containing `what`."""
    msg, path = load_error(tmp_path, text, **kw)
    assert msg.startswith(f"{path}:{line_of(text, needle)}: "), msg
    assert what in msg, msg

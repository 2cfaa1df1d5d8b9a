"""singa.job.config: SINGA's confs parse; every bad input gives one line `file:line: what`."""
import ast
import os
import pathlib

import pytest

import singa
from conf_helpers import GOOD, expect_error, line_of, load_error, write_conf
from singa.errors import ConfigError
from singa.job import config, workspace
from singa.net.neuralnet import filter_phase
from singa.proto import job_pb2

CONFS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "confs"
ALL_CONFS = sorted(CONFS.glob("*/*.conf"))
UNPARSEABLE = {"rnnlm", "rbm_job"}
DATA, FC, W, B = 'name: "data"', 'name: "fc"', 'name: "w"', 'name: "b"'



@pytest.mark.parametrize("path", [p for p in ALL_CONFS
                                  if not any(u in p.name or u in p.parent.name for u in UNPARSEABLE)],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_singa_example_confs_parse(path):
    job = config.load_job(str(path), check_paths=False, check_layers=False)
    assert job.neuralnet.layer and (job.train_steps > 0 or job.test_steps > 0)
    kept = filter_phase(job.neuralnet, job_pb2.kTrain) + filter_phase(job.neuralnet, job_pb2.kTest)
    assert all(layer.HasField("unroll_len") for layer in kept)


@pytest.mark.parametrize("name", ["rbm_job.conf", "rbm_job-v0.1.0.conf"])
def test_stale_rbm_job_conf_is_recognised(name):
    with pytest.raises(ConfigError, match=name + r":9: not a SINGA 0.2/0.3 job conf \(stale pre-0.1"):
        config.load_job(str(CONFS / "mnist" / name), check_paths=False, check_layers=False)


def test_good_conf_loads_and_leaves_the_workspace_to_the_job(tmp_path):
    """The check reads; the job's hold on its workspace (singa.job.workspace) makes the folder."""
    job = config.load_job(str(write_conf(tmp_path, GOOD)), check_layers=False)
    assert [layer.name for layer in job.neuralnet.layer] == ["data", "data", "fc", "loss"]
    assert not (tmp_path / "ws").exists()
    workspace.hold(job.cluster.workspace, 1).close()
    assert (tmp_path / "ws").is_dir()


def test_missing_required_field_names_layer_and_path(tmp_path):
    text = GOOD.replace("      num_output: 2\n", "")
    expect_error(tmp_path, text, "innerproduct_conf {",
            "layer 'fc': required field neuralnet.layer[2].innerproduct_conf.num_output is missing")


def test_missing_layer_name(tmp_path):
    text = GOOD.replace('    name: "loss"\n', "")
    msg, path = load_error(tmp_path, text)
    layer_line = line_of(text, "kSoftmaxLoss") - 1
    assert msg == f"{path}:{layer_line}: required field neuralnet.layer[3].name is missing"


def test_layer_type_not_implemented(tmp_path, monkeypatch):
    from singa.layers import base
    monkeypatch.setattr(base, "_REGISTRY", dict.fromkeys(
        [job_pb2.kRecordInput, job_pb2.kInnerProduct, job_pb2.kSoftmaxLoss]))
    config.load_job(str(write_conf(tmp_path, GOOD)))
    text = GOOD.replace("    type: kSoftmaxLoss\n", '    user_type: "kNoSuchLayer"\n')
    expect_error(tmp_path, text, 'name: "loss"', "layer 'loss': layer type kNoSuchLayer is not implemented")


def test_srclayer_naming_no_layer(tmp_path):
    expect_error(tmp_path, GOOD.replace('srclayers: "fc"', 'srclayers: "fc9"'), '"fc9"',
            "layer 'loss': srclayer 'fc9' names no layer", check_layers=False)


@pytest.mark.parametrize("test", [False, True], ids=["train", "test"])
def test_srclayer_missing_from_phase(tmp_path, test):
    text = GOOD.replace("    include: kTest\n", "    include: kTest\n    srclayers: \"fc\"\n", 1)
    text = text.replace('    name: "fc"\n', '    name: "fc"\n    include: kTrain\n')
    expect_error(tmp_path, text, '    srclayers: "fc"', "srclayer 'fc' is not in the kTest net",
            check_layers=False, test=test)


def test_duplicate_layer_name_in_one_phase(tmp_path):
    text = GOOD.replace("    include: kTest\n", "")
    msg, path = load_error(tmp_path, text, check_layers=False)
    assert msg.startswith(f"{path}:{line_of(text, 'TEST') - 3}: duplicate layer name 'data' in the kTrain net")
    assert f"also at line {line_of(text, DATA)}" in msg


def test_duplicate_param_name(tmp_path):
    msg, path = load_error(tmp_path, GOOD.replace(B, 'name: "w"'), check_layers=False)
    assert msg == (f"{path}:{line_of(GOOD, B)}: layer 'fc': duplicate param name 'w' "
                   f"in the kTrain net (also at line {line_of(GOOD, W)})")


def test_unnamed_params(tmp_path):
    text = GOOD.replace('      name: "w"\n', "").replace('      name: "b"\n', "")
    msg, path = load_error(tmp_path, text, check_layers=False)
    assert "duplicate unnamed param" in msg and msg.startswith(path + ":")


def test_cycle(tmp_path):
    text = GOOD.replace('srclayers: "data"\n    innerproduct_conf',
                        'srclayers: "data"\n    srclayers: "b"\n    innerproduct_conf')
    text = text.replace("\n}\ncluster", '\n  layer {\n    name: "a"\n    srclayers: "fc"\n  }\n'
                        '  layer {\n    name: "b"\n    srclayers: "a"\n  }\n}\ncluster')
    msg, path = load_error(tmp_path, text, check_layers=False)
    assert msg == f"{path}:{line_of(text, FC)}: srclayers form a cycle: fc -> a -> b -> fc"


def test_rbm_two_way_edge_is_not_a_cycle(tmp_path):
    text = GOOD.replace('srclayers: "fc"\n', 'srclayers: "fc"\n    srclayers: "hid"\n')
    text = text.replace("\n}\ncluster", '\n  layer {\n    name: "hid"\n    srclayers: "loss"\n  }\n}\ncluster')
    config.load_job(str(write_conf(tmp_path, text)), check_layers=False)


def test_include_and_exclude_mixed(tmp_path):
    text = GOOD.replace('    srclayers: "fc"\n', '    srclayers: "fc"\n    exclude: kTest\n')
    expect_error(tmp_path, text, 'name: "loss"', "don't use include and exclude together",
            check_layers=False)


def test_share_from_naming_no_param(tmp_path):
    text = GOOD.replace('name: "b"\n', 'name: "b"\n      share_from: "w0"\n')
    expect_error(tmp_path, text, 'share_from: "w0"', "layer 'fc': share_from 'w0' names no param",
            check_layers=False)


def test_missing_data_path(tmp_path):
    text = GOOD.replace("TEST", "/nonexistent/test.bin")
    expect_error(tmp_path, text, "/nonexistent/test.bin",
            "layer 'data': store_conf.path '/nonexistent/test.bin' does not exist", check_layers=False)
    # the test net is not built without test_steps, so its data need not exist
    config.load_job(str(write_conf(tmp_path, text.replace("test_steps: 2", "test_steps: 0"))),
                    check_layers=False)


def test_missing_alg(tmp_path):
    expect_error(tmp_path, GOOD.replace("  alg: kBP\n", ""), "train_one_batch {",
            "train_one_batch.alg is not set", check_layers=False)


def test_missing_updater(tmp_path):
    text = GOOD.replace("  type: kSGD\n", "")
    expect_error(tmp_path, text, "updater {", "updater.type is not set", check_layers=False)


def test_workspace_without_parent(tmp_path):
    text = GOOD.replace('"WS"', '"/nonexistent/dir/ws"')
    expect_error(tmp_path, text, "workspace:", "cluster.workspace '/nonexistent/dir/ws' does not exist",
            check_layers=False)


def test_val_net_checked_only_with_validate_steps(tmp_path):
    text = GOOD.replace('  layer {\n    name: "fc"',
                        '  layer {\n    name: "v"\n    include: kVal\n    srclayers: "x"\n  }\n'
                        '  layer {\n    name: "fc"')
    config.load_job(str(write_conf(tmp_path, text)), check_layers=False)
    expect_error(tmp_path, text.replace("test_steps: 2", "test_steps: 2\nvalidate_steps: 1"),
            'srclayers: "x"', "srclayer 'x' names no layer", check_layers=False)


TRAIN_DATA = """\
  layer {
    name: "data"
    type: kRecordInput
    store_conf {
      path: "TRAIN"
      batchsize: 4
    }
    include: kTrain
  }
"""


def test_conf_made_for_testing_alone_loads_for_test_only(tmp_path):
    """-test builds only the kTest net (SINGA's Driver::Test): a conf whose one data layer is
    `include: kTest` loads for it; training still refuses it."""
    assert TRAIN_DATA in GOOD
    text = GOOD.replace(TRAIN_DATA, "")
    job = config.load_job(str(write_conf(tmp_path, text)), test=True)
    assert [layer.name for layer in job.neuralnet.layer] == ["data", "fc", "loss"]
    expect_error(tmp_path, text, '    srclayers: "data"',
                 "layer 'fc': srclayer 'data' is not in the kTrain net")


VAL_NET = GOOD.replace("test_steps: 2", "test_steps: 2\nvalidate_steps: 1").replace(
    '  layer {\n    name: "fc"', '  layer {\n    name: "v"\n    type: kSigmoid\n    include: kVal\n'
                                 '    srclayers: "x"\n  }\n  layer {\n    name: "fc"')


@pytest.mark.parametrize("text, needle, what", [
    (GOOD.replace("TRAIN", "/nonexistent/train.bin"), "/nonexistent/train.bin",
     "layer 'data': store_conf.path '/nonexistent/train.bin' does not exist"),
    (GOOD.replace("  type: kSGD\n", ""), "updater {", "updater.type is not set"),
    (VAL_NET, 'srclayers: "x"', "srclayer 'x' names no layer"),
], ids=["train-data", "updater", "val-net"])
def test_test_run_checks_nothing_only_training_uses(tmp_path, text, needle, what):
    """Training refuses each; -test, which uses none of them, loads the conf."""
    expect_error(tmp_path, text, needle, what)
    config.load_job(str(write_conf(tmp_path, text)), test=True)


def test_parse_job_from_string():
    job = config.parse_job(GOOD, check_paths=False, check_layers=False)
    assert isinstance(job, job_pb2.JobProto) and job.test_steps == 2
    with pytest.raises(ConfigError, match=r"^<string>:2: "):
        config.parse_job(GOOD.replace("train_steps", "trainsteps"), check_paths=False)


def test_singa_conf(tmp_path):
    path = tmp_path / "singa.conf"
    path.write_text('zookeeper_host: "127.0.0.1:2182"\n')
    conf = config.load_singa_conf(str(path))
    assert conf.zookeeper_host == "127.0.0.1:2182" and conf.log_dir == "/tmp/singa-log/"
    path.write_text('zookeeper_host: "h:1"\nlogdir: "x"\n')
    with pytest.raises(ConfigError, match=r"singa.conf:2: .*no field named \"logdir\""):
        config.load_singa_conf(str(path))


def test_resolve_relative_to_singa_home():
    assert singa.resolve("examples/mnist") == os.path.join(singa.HOME, "examples", "mnist")
    assert singa.resolve("/abs/x") == "/abs/x"


def test_the_layers_do_not_import_config():
    """config imports the layers (to check types are registered); they do not import it back."""
    for path in pathlib.Path(singa.HOME, "singa", "layers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert "singa.job.config" not in names, f"{path.name}:{node.lineno} imports singa.job.config"


IP = "innerproduct_conf {\n      num_output: 2\n    }"
CONV = IP + "\n    convolution_conf {\n      num_filters: 4\n    }"
SIZES = {
    "num_output 0": ("num_output: 2", "num_output: 0", "num_output",
                     "layer 'fc': innerproduct_conf.num_output must be at least 1, got 0"),
    "num_filters 0": (IP, CONV.replace("num_filters: 4", "num_filters: 0"), "num_filters",
                      "layer 'fc': convolution_conf.num_filters must be at least 1, got 0"),
    "kernel 0": (IP, CONV + "\n    pooling_conf {\n      kernel: 0\n    }", "kernel",
                 "layer 'fc': pooling_conf.kernel must be at least 1, got 0"),
    "stride 0": (IP, CONV.replace("num_filters: 4", "num_filters: 4\n      stride: 0"), "stride",
                 "layer 'fc': convolution_conf.stride must be at least 1, got 0"),
    "negative batchsize": ("batchsize: 4", "batchsize: -4", "batchsize",
                           "layer 'data': store_conf.batchsize must be at least 1, got -4"),
    "hdim 0": ("num_output: 2\n    }", "num_output: 2\n    }\n    rbm_conf {\n      hdim: 0\n    }",
               "hdim", "layer 'fc': rbm_conf.hdim must be at least 1, got 0"),
    "nworkers_per_procs 0": ('workspace: "WS"', 'workspace: "WS"\n  nworkers_per_procs: 0',
                             "nworkers_per_procs", "cluster.nworkers_per_procs must be at least 1, got 0"),
    "negative train_steps": ("train_steps: 10", "train_steps: -1", "train_steps",
                             "train_steps must be at least 0, got -1"),
    "negative init std": ('name: "w"\n', 'name: "w"\n      init {\n        type: kGaussian\n'
                          '        std: -0.1\n      }\n', "std",
                          "layer 'fc': param[0].init.std must be at least 0, got -0.1"),
}


@pytest.mark.parametrize("case", SIZES)
def test_zero_or_negative_size_names_field_and_line(tmp_path, case):
    old, new, needle, what = SIZES[case]
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    expect_error(tmp_path, text, needle, what)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_learning_rate_names_field_and_line(tmp_path, value):
    expect_error(tmp_path, GOOD.replace("base_lr: 0.1", f"base_lr: {value}"), "base_lr",
            f"updater.learning_rate.base_lr must be a finite number, got {float(value)}")


@pytest.mark.parametrize("name, what", [
    ("x/../../../../tmp/pwn", "may not contain '/'"),
    ("n" * 256, "256 bytes long; a job name may have at most 230")])
def test_job_name_that_cannot_name_the_log_file_is_refused_at_load(tmp_path, name, what):
    expect_error(tmp_path, GOOD.replace('name: "t"', f'name: "{name}"'), name[:20], what)


@pytest.mark.parametrize("head, needle, what", [
    ('checkpoint_keep_best: "acc"\n', "checkpoint_keep_best",
     'checkpoint_keep_best "acc": the test net\'s layers produce accuracy, loss'),
    ('checkpoint_keep_best: "validation/accuracy"\n', "checkpoint_keep_best",
     'monitors the validation metrics, but validate_steps is 0: no validation runs'),
    ('checkpoint_keep_best: "train/loss"\n', "checkpoint_keep_best",
     'checkpoint_keep_best "train/loss": the phase must be test or validation'),
    ('checkpoint_on_improvement: true\n', "checkpoint_on_improvement",
     "checkpoint_on_improvement needs checkpoint_keep_best, the metric it monitors"),
    ('checkpoint_keep_best: "loss"\ncheckpoint_keep_best_k: 0\n', "checkpoint_keep_best_k",
     "checkpoint_keep_best_k must be at least 1, got 0"),
])
def test_checkpoint_keep_best_is_a_metric_of_a_phase_that_runs(tmp_path, head, needle, what):
    expect_error(tmp_path, head + GOOD, needle, what)


def test_checkpoint_keep_best_accepts_what_the_layers_produce(tmp_path):
    for monitor in ("accuracy", "Loss", "test/accuracy"):
        job = config.load_job(str(write_conf(tmp_path, f'checkpoint_keep_best: "{monitor}"\n' + GOOD)))
        assert job.checkpoint_keep_best == monitor
    text = GOOD.replace("test_steps: 2", "test_steps: 2\nvalidate_steps: 1")
    text = text.replace("    include: kTest\n", "    include: kTest\n    include: kVal\n")
    job = config.load_job(str(write_conf(tmp_path, 'checkpoint_keep_best: "validation/loss"\n'
                                              'checkpoint_on_improvement: true\n' + text)))
    assert job.checkpoint_on_improvement

"""User extensions: a user's .proto compiled at run time makes its LayerProto extensions parse
(named by the conf or by the caller), and a user's Python file registers layer types."""
import pathlib

import pytest

import singa
from singa import extensions
from singa.errors import ConfigError
from singa.job import config
from singa.layers.base import unavailable
from singa.proto import job_pb2

CONFS = pathlib.Path(singa.HOME) / "tests" / "fixtures" / "confs"
RNNLM_PROTO = str(pathlib.Path(singa.HOME) / "examples" / "rnnlm" / "rnnlm.proto")

PROTO = """\
syntax = "proto2";
import "job.proto";
package {pkg};
message ScaleProto {{ optional float factor = 1 [default = 2]; }}
extend singa.LayerProto {{ optional ScaleProto scale_conf = {number}; }}
"""

LAYERS = """\
from singa.layers.base import Layer, register

@register("{user_type}")
class ScaleLayer(Layer):
    def setup(self, srclayers):
        self.data = srclayers[0].data
"""

CONF = """\
name: "ext"
{head}
train_one_batch {{ alg: kBP }}
neuralnet {{
  layer {{ name: "data" type: kRecordInput store_conf {{ path: "x" batchsize: 1 shape: 1 }} }}
  layer {{ name: "scale" user_type: "{user_type}" srclayers: "data"
           [{pkg}.scale_conf] {{ factor: 3 }} }}
}}
cluster {{ workspace: "ws" }}
"""


def write(tmp_path, pkg, user_type, head="", number=1050):
    """<pkg>.proto (extension scale_conf = `number`), <pkg>_layers.py; returns a conf using them."""
    (tmp_path / f"{pkg}.proto").write_text(PROTO.format(pkg=pkg, number=number))
    (tmp_path / f"{pkg}_layers.py").write_text(LAYERS.format(user_type=user_type))
    return CONF.format(head=head, pkg=pkg, user_type=user_type)


def test_conf_naming_its_proto_and_layers_parses_the_extension(tmp_path):
    text = write(tmp_path, "ext_a", "kScaleA", f'user_proto: "{tmp_path}/ext_a.proto"\n'
                                               f'user_layers: "{tmp_path}/ext_a_layers.py"')
    job = config.parse_job(text, check_paths=False)
    ns = extensions.load_proto(tmp_path / "ext_a.proto")
    assert job.neuralnet.layer[1].Extensions[ns.scale_conf].factor == 3
    assert ns.ScaleProto().factor == 2
    assert unavailable(job.neuralnet.layer[1]) is None
    assert list(job.user_proto) == [f"{tmp_path}/ext_a.proto"]


def test_proto_and_layers_given_by_the_caller_serve_a_conf_that_names_none(tmp_path):
    text = write(tmp_path, "ext_b", "kScaleB", number=1051)
    job = config.parse_job(text, check_paths=False, user_proto=[str(tmp_path / "ext_b.proto")],
                           user_layers=[str(tmp_path / "ext_b_layers.py")])
    assert unavailable(job.neuralnet.layer[1]) is None


def test_singa_rnnlm_conf_parses_with_rnnlm_proto():
    job = config.load_job(str(CONFS / "rnnlm" / "job.conf"), check_paths=False,
                          check_layers=False, user_proto=[RNNLM_PROTO])
    rnnlm = extensions.load_proto(RNNLM_PROTO)
    data = job.neuralnet.layer[0].Extensions[rnnlm.data_conf]
    assert (data.path, data.max_window, data.backend) == ("examples/rnnlm/train_data.bin", 10,
                                                          "kvfile")
    loss = job.neuralnet.layer[4].Extensions[rnnlm.loss_conf]
    assert (loss.nclass, loss.vocab_size) == (100, 3720)
    assert extensions.load_proto(RNNLM_PROTO) is rnnlm   # compiled once


def test_a_conf_without_its_proto_says_how_to_name_it(tmp_path):
    # an extension no test loads: the default pool keeps every .proto loaded in the process
    text = CONF.format(head="", pkg="ext_never_loaded", user_type="kScale")
    with pytest.raises(ConfigError, match=r"<string>:7: extension \[ext_never_loaded.scale_conf\] "
                                          r"is not defined: name the .proto file that defines it "
                                          r"with user_proto in the conf or the -user_proto flag"):
        config.parse_job(text, check_paths=False, check_layers=False)


def test_a_missing_user_proto_is_reported_at_its_conf_line(tmp_path):
    text = write(tmp_path, "ext_c", "kScaleC", 'user_proto: "no/such.proto"', number=1052)
    with pytest.raises(ConfigError, match=r"<string>:2: user_proto 'no/such.proto' does not exist"):
        config.parse_job(text, check_paths=False)


def test_a_proto_with_an_error_names_its_file_and_line(tmp_path):
    (tmp_path / "bad_ext.proto").write_text('syntax = "proto2";\nmessage A {\n  optional int32 = 1;\n}\n')
    with pytest.raises(ConfigError, match=rf"{tmp_path}/bad_ext.proto:3: Expected field name"):
        extensions.load_proto(tmp_path / "bad_ext.proto")


def test_two_different_protos_of_one_name_are_refused(tmp_path):
    for sub, field in (("one", "a"), ("two", "b")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "same_name.proto").write_text(
            f'syntax = "proto2";\npackage same_{sub};\nmessage M {{ optional int32 {field} = 1; }}\n')
    extensions.load_proto(tmp_path / "one" / "same_name.proto")
    with pytest.raises(ConfigError, match=r"two/same_name.proto: cannot load same_name.proto: "
                                          r".*duplicate file name"):
        extensions.load_proto(tmp_path / "two" / "same_name.proto")


def test_user_layers_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no_layers.py: no such Python file of user layers"):
        extensions.load_layers(tmp_path / "no_layers.py")


def test_builtin_protos_are_untouched_by_user_extensions():
    assert job_pb2.LayerProto.DESCRIPTOR.file.name == "job.proto"

"""The generated protobuf modules: current, SINGA 0.3's numbers/defaults, SINGA's bytes."""
import json
import pathlib
import subprocess
import sys

import numpy as np
from google.protobuf import descriptor as _d

from singa.proto import common_pb2, job_pb2, singa_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
SINGA_PROTOS = ROOT / "tests" / "fixtures" / "singa-0.3" / "protos.json"
MODULES = {"common.proto": common_pb2, "job.proto": job_pb2, "singa.proto": singa_pb2}


def test_generated_modules_are_current(tmp_path):
    subprocess.run(["sh", str(ROOT / "proto" / "generate.sh"), str(tmp_path), sys.executable],
                   check=True, capture_output=True)
    for name in ("common_pb2.py", "job_pb2.py", "singa_pb2.py"):
        assert (tmp_path / name).read_bytes() == (ROOT / "singa" / "proto" / name).read_bytes(), \
            f"singa/proto/{name} is stale: run proto/generate.sh"


def test_generated_modules_import_without_warnings():
    code = "from singa.proto import common_pb2, job_pb2, singa_pb2"
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def _field(msg, name):
    return msg.DESCRIPTOR.fields_by_name[name]


def test_spot_checks_against_singa_protos():
    assert job_pb2.JobProto().reset_param_version is True
    assert _field(job_pb2.JobProto, "reset_param_version").number == 63
    assert job_pb2.PoolingProto().stride == 2
    assert _field(job_pb2.PoolingProto, "stride").type == _d.FieldDescriptor.TYPE_UINT32
    assert _field(job_pb2.LayerProto, "name").is_required
    assert job_pb2.LayerProto().type == job_pb2.kUserLayer == 600
    assert job_pb2.ParamGenProto().type == job_pb2.kUserInit
    assert job_pb2.ParamGenProto().value == 1.0
    assert np.float32(job_pb2.UpdaterProto().delta) == np.float32(1e-8)
    assert _field(common_pb2.BlobProto, "data").is_packed
    assert not _field(common_pb2.BlobProto, "shape").is_packed
    assert not _field(common_pb2.BlobProtos, "version").is_packed
    numbers = {f.name: f.number for f in common_pb2.BlobProtos.DESCRIPTOR.fields}
    assert {k: numbers[k] for k in ("id", "version", "name", "blob")} == \
        {"id": 2, "version": 3, "name": 4, "blob": 5}
    assert singa_pb2.SingaProto().zookeeper_host == "localhost:2181"
    assert job_pb2.LayerProto.DESCRIPTOR.extension_ranges == [(1001, 1101)]


def test_additions_stay_outside_singa_extension_ranges():
    added = {common_pb2.BlobProtos: {"step": 300, "param_state": 301, "rng": 302, "reader": 303,
                                     "lr_index": 304, "nworkers": 305, "metric_name": 306,
                                     "metric_value": 307, "piece": 309, "crc32": 310},
             job_pb2.JobProto: {"seed": 300, "checkpoint_keep_newest": 301, "max_restarts": 310,
                                "checkpoint_keep_best": 302, "checkpoint_keep_best_k": 303,
                                "checkpoint_on_improvement": 304, "new_data": 330,
                                "test_at_end": 331},
             job_pb2.ConvolutionProto: {"group": 300}, job_pb2.PoolingProto: {"ceil_mode": 300},
             job_pb2.StoreProto: {"whole_pass": 300, "root_folder": 301, "new_height": 302,
                                  "new_width": 303, "is_color": 304, "shuffle": 305,
                                  "target_dim": 306},
             job_pb2.RGBImageProto: {"center_crop": 300}, common_pb2.RecordProto: {"target": 300}}
    for msg, fields in added.items():
        for name, number in fields.items():
            assert _field(msg, name).number == number
            assert not (101 <= number <= 200 or 1001 <= number <= 1100)
    assert _field(common_pb2.BlobProtos, "crc32").type == _d.FieldDescriptor.TYPE_FIXED32


def test_checkpoint_bytes_match_reference_example():
    """Two params as SINGA 0.3 serialises them, byte for byte."""
    bp = common_pb2.BlobProtos()
    for name, shape, data in (("0#w1", (2, 3), [.1, .2, .3, .4, .5, .6]), ("0#b1", (2,), [1, -1])):
        bp.version.append(100)
        bp.name.append(name)
        blob = bp.blob.add()
        blob.shape.extend(shape)
        blob.data.extend(data)
    expected = bytes.fromhex(
        "18641864" "220430237731" "220430236231"
        "2a1e080208031218" "cdcccc3dcdcc4c3e9a99993ecdcccc3e0000003f9a99193f"
        "2a0c08021208" "0000803f000080bf")
    assert bp.SerializeToString() == expected


# ---- every message, enum, field, label, default, packed flag and extension range of SINGA 0.3 ----

def _singa_protos():
    """{file: {"enums", "messages", "extension_ranges"}} of SINGA 0.3's common/job/singa.proto."""
    return json.loads(SINGA_PROTOS.read_text())


# our fields and values start here
ADDED = {"BlobProtos": 300, "JobProto": 300, "MsgType": 300, "ClusterProto": 300,
         "ConvolutionProto": 300, "PoolingProto": 300, "StoreProto": 300, "LRNProto": 300,
         "SoftmaxProto": 300, "RGBImageProto": 300, "RecordProto": 300, "LayerType": 700,
         "LayerProto": 700}


def _label(f):
    return "required" if f.is_required else "repeated" if f.is_repeated else "optional"


_SCALARS = {_d.FieldDescriptor.TYPE_INT32: "int32", _d.FieldDescriptor.TYPE_UINT32: "uint32",
            _d.FieldDescriptor.TYPE_FLOAT: "float", _d.FieldDescriptor.TYPE_BOOL: "bool",
            _d.FieldDescriptor.TYPE_STRING: "string", _d.FieldDescriptor.TYPE_BYTES: "bytes"}


def _default_matches(f, want):
    got = f.default_value
    if f.type == _d.FieldDescriptor.TYPE_ENUM:
        return f.enum_type.values_by_number[got].name == want
    if f.type == _d.FieldDescriptor.TYPE_FLOAT:
        return np.float32(got) == np.float32(want)
    if f.type == _d.FieldDescriptor.TYPE_BOOL:
        return str(got) == want
    if f.type == _d.FieldDescriptor.TYPE_STRING:
        return f'"{got}"' == want
    return got == int(want)


def test_descriptors_match_every_field_of_singa_protos():
    for fname, spec in _singa_protos().items():
        fdesc = MODULES[fname].DESCRIPTOR
        for ename, values in spec["enums"].items():
            outer, _, nested = ename.partition(".")
            ed = fdesc.message_types_by_name[outer].enum_types_by_name[nested] if nested \
                else fdesc.enum_types_by_name[ename]
            ours = [[v.name, v.number] for v in ed.values if v.number < ADDED.get(ename, 1 << 29)]
            assert ours == values, ename
        for mname, rows in spec["messages"].items():
            md = fdesc.message_types_by_name[mname]
            ours = [f for f in md.fields if f.number < ADDED.get(mname, 1 << 29)]
            assert [f.name for f in ours] == [r[0] for r in rows], mname
            for f, (name, number, label, typ, default) in zip(ours, rows):
                where = f"{mname}.{name}"
                assert f.number == number and _label(f) == label, where
                tname = f.message_type.name if f.message_type else \
                    f.enum_type.name if f.enum_type else _SCALARS[f.type]
                assert tname == typ.removesuffix(" [packed]"), where
                assert f.is_packed == typ.endswith("[packed]"), where
                assert f.has_presence or label == "repeated", where
                if default:
                    assert f.has_default_value and _default_matches(f, default), where
                elif label != "repeated":
                    assert not f.has_default_value, where
            rng = spec["extension_ranges"].get(mname)
            assert md.extension_ranges == ([(rng[0], rng[1] + 1)] if rng else []), mname

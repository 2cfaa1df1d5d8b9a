"""User extensions (SINGA's examples/rnnlm): .proto files extending LayerProto, compiled when a
job conf is read, and Python files registering user layer classes (docs/user-layers.md).

A .proto file is compiled by protoc (grpcio-tools) into descriptors, which go into protobuf's
default pool beside SINGA's own; no generated code is executed. A layer file is imported as a
module; it registers its classes with `singa.layers.base.register("kMyLayer")`.
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import types

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from singa.errors import ConfigError
from singa.proto import common_pb2, job_pb2

_PROTOS = {}   # absolute path -> namespace of its messages and extensions
_MODULES = {}  # absolute path -> module


def load_proto(path):
    """The messages and extensions of the .proto file `path` by name, e.g. `.DataProto`,
    `.data_conf` (for `layer_conf.Extensions[...]`), once compiled and added to the default
    pool; once per file. It may import SINGA's "job.proto" and "common.proto" and files beside it.
    """
    path = os.path.abspath(path)
    if path in _PROTOS:
        return _PROTOS[path]
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such .proto file")
    pool = descriptor_pool.Default()
    ours = descriptor_pb2.FileDescriptorSet()
    for module in (common_pb2, job_pb2):
        module.DESCRIPTOR.CopyToProto(ours.file.add())
    with tempfile.TemporaryDirectory() as tmp:
        base, out = os.path.join(tmp, "singa.pb"), os.path.join(tmp, "user.pb")
        with open(base, "wb") as f:
            f.write(ours.SerializeToString())
        run = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_in={base}",
                              f"-I{os.path.dirname(path)}", "--include_imports",
                              f"--descriptor_set_out={out}", os.path.basename(path)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise ConfigError(_protoc_error(run.stderr, path))
        with open(out, "rb") as f:
            compiled = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    name = os.path.basename(path)
    for file in compiled.file:   # dependencies first; SINGA's own are in the pool already
        if file.name == name or not _known(pool, file.name):
            try:
                pool.Add(file)   # a file added before is accepted again only if identical
            except TypeError as e:
                raise ConfigError(f"{path}: cannot load {file.name}: {e}") from None
    desc = pool.FindFileByName(name)
    names = {name: message_factory.GetMessageClass(m) for name, m in desc.message_types_by_name.items()}
    names.update(desc.extensions_by_name)
    _PROTOS[path] = types.SimpleNamespace(**names)
    return _PROTOS[path]


def load_layers(path):
    """Import the Python file `path` (its layer classes register themselves); once per file."""
    path = os.path.abspath(path)
    if path not in _MODULES:
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such Python file of user layers")
        name = "singa_user_layers." + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _MODULES[path] = module
    return _MODULES[path]


def _known(pool, name):
    try:
        pool.FindFileByName(name)
    except KeyError:
        return False
    return True


def _protoc_error(stderr, path):
    """`<file>:<line>: <what>` of protoc's first error (in `path` or a file it imports)."""
    for line in stderr.splitlines():
        m = re.match(r"(\S+\.proto):(\d+):\d+: (.*)", line)
        if m and not m.group(3).startswith("warning:"):
            return f"{os.path.join(os.path.dirname(path), m.group(1))}:{m.group(2)}: {m.group(3)}"
    return f"{path}: protoc failed: {' '.join(stderr.split())}"

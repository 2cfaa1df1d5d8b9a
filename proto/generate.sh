#!/bin/sh
# Regenerate singa/proto/*_pb2.py from proto/*.proto (needs grpcio-tools); caffe.proto is
# Caffe's own schema (package caffe), read by bin/singa-import.sh.
# Usage: proto/generate.sh [OUTDIR] [PYTHON]   (defaults: singa/proto, python3)
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../singa/proto}
py=${2:-${PYTHON:-python3}}
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I "$here" --python_out="$out" \
    "$here/common.proto" "$here/job.proto" "$here/singa.proto" "$here/caffe.proto"
# protoc writes `import common_pb2`; inside the singa.proto package the import must be absolute,
# and the messages' module must be the package's, so that they pickle (a Model holds them).
for f in "$out"/*_pb2.py; do
    sed -i -e 's/^import \([a-z_]*_pb2\) as /from singa.proto import \1 as /' \
        -e "s/(DESCRIPTOR, '\([a-z_]*_pb2\)', _globals)/(DESCRIPTOR, 'singa.proto.\1', _globals)/" "$f"
done

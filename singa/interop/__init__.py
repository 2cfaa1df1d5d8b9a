"""Models in and out: other frameworks' formats beside SINGA's.

caffe/: Caffe's net, weights and solver state read (netdef, blobs, translate, solverstate) and
written (write); onnx: a job's test net as an ONNX model; graph: a job's test net with a
snapshot's values, what both writers read; importer / exporter: bin/singa-import.sh and
bin/singa-export.sh.
"""

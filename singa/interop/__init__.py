"""Models in and out: other frameworks' formats beside SINGA's.

caffe/: Caffe's net, weights and solver state read (netdef, translate, solverstate,
importer: bin/singa-import.sh) and written (write); onnx: a job's test net as an ONNX model;
deploy: a job's test net with a snapshot's values, what both writers read; exporter:
bin/singa-export.sh.
"""

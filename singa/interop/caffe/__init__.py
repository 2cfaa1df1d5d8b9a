"""Caffe's formats. In: a net (`.prototxt`), its weights (`.caffemodel`) and solver state as a
SINGA job.conf and checkpoint (importer: bin/singa-import.sh caffe). Out: a snapshot as a
deploy net and `.caffemodel` (bin/singa-export.sh caffe).

netdef: NetParameter from text or binary, V1/V0 layers and the deprecated input header
upgraded (the binary files walked by `singa.io.caffe_blobs`); translate: Caffe layers → SINGA
layers and params, with data (the data layers and transform_param) and batchnorm (BatchNorm
and Scale, and -fold-bn); solverstate: the solver's updater and learning rate, the momentum
history; importer: all of them as a job.conf and snapshot; write: a job's test net as Caffe's
deploy net and weights.
"""

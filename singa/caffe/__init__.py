"""Caffe models in: a net (`.prototxt`), its weights (`.caffemodel`) and solver state as a
SINGA job.conf and checkpoint (bin/singa-import.sh caffe).

netdef: NetParameter from text or binary, V1/V0 layers and the deprecated input header
upgraded; blobs: `.caffemodel`/`.solverstate`/`.binaryproto` walked through mmap, values viewed
in place; translate: Caffe layers → SINGA layers and params; solverstate: the solver's updater
and learning rate, the momentum history; cli: the command.
"""

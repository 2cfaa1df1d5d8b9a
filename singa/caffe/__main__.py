"""python -m singa.caffe: bin/singa-import.sh caffe (see singa.caffe.cli)."""
import sys

from singa.caffe.cli import main

sys.exit(main())

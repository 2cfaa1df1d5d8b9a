"""python -m singa.export onnx|caffe JOB.conf SNAPSHOT -o OUT (see cli)."""
import sys

from singa.export.cli import main

sys.exit(main())

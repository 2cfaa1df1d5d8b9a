"""python -m singa.checkpoint ls|show|diff|merge (see cli)."""
import os
import sys

from singa.checkpoint.cli import main

try:
    sys.exit(main())
except BrokenPipeError:     # `... show FILE | head`: the reader left; no traceback
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)

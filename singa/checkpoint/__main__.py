"""python -m singa.checkpoint ls|show|diff (see cli)."""
import sys

from singa.checkpoint.cli import main

sys.exit(main())

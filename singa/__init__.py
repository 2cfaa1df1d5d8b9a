"""singa: a Python re-implementation of Apache SINGA v0.x."""
import os

#: The SINGA home: the repository root; relative paths in confs resolve against it.
HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

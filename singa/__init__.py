"""singa: a Python re-implementation of Apache SINGA v0.x."""
import os

#: The SINGA home: the repository root; relative paths in confs resolve against it.
HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve(path):
    """`path` made absolute; relative paths are relative to the SINGA home (SINGA runs from
    there). A store URL (`memory://0`) is no file path and stays as it is."""
    if "://" in path:
        return path
    return os.path.normpath(os.path.join(HOME, os.path.expanduser(path)))

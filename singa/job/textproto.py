"""Protobuf text format with line numbers: a conf file's text parsed into a message, every
error one line `file:line: what` (ConfigError), the line of any field at hand for checks.

`TextConf.parse` reports parse errors, unknown fields and enum values, and missing required
fields at their lines; a kind of conf adds its own checks by overriding `check` (and may word
errors its way through `missing` and `parse_error`).
"""
import collections
import re

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor

from singa import resolve
from singa.errors import ConfigError


def read_text(path):
    """The text of conf file `path`; ConfigError if it cannot be read or is not UTF-8."""
    try:
        with open(resolve(path), "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text") from None


class TextConf:
    """The text of one conf file and the line of every field in it, for error messages."""

    def __init__(self, text, path, line_offset=0):
        self.text = text
        self.path = path
        self.line_offset = line_offset   # lines of the file before `text`
        self.lines = {}

    def fail(self, line, what):
        """A ConfigError naming the file and `line`; one line, not chained to an error being
        handled (a user's mistake shows no traceback of ours)."""
        raise ConfigError(f"{self.path}:{line + self.line_offset}: {what}") from None

    def parse(self, msg, allow_unknown_extension=False):
        """Parse into `msg`, then check required fields and what `check` checks."""
        try:
            text_format.Parse(self.text, msg, allow_unknown_extension=allow_unknown_extension)
        except text_format.ParseError as e:
            self.fail(e.GetLine() or 1, self.parse_error(e))
        self.lines = field_lines(self.text, msg.DESCRIPTOR)
        missing = msg.FindInitializationErrors()
        if missing:
            self.fail(self.line(missing[0]), self.missing(msg, missing[0]))
        self.check(msg)
        return msg

    def check(self, msg):
        """The checks of a kind of conf, on the parsed `msg` (none here)."""

    def missing(self, msg, path):
        """The error for required field `path` of `msg` unset."""
        return f"required field {path} is missing"

    def parse_error(self, e):
        """protobuf's ParseError `e` without its position and the echo of the line."""
        msg = re.sub(r"^\d+:\d+ : ", "", str(e))
        lines = self.text.splitlines()
        if e.GetLine() and e.GetLine() <= len(lines):
            msg = msg.removeprefix(f"'{lines[e.GetLine() - 1]}': ")
        return " ".join(msg.split())

    def line(self, *paths):
        """Line of the first of `paths` (FindInitializationErrors syntax) or of its nearest
        enclosing message found in the text; 1 if none."""
        for path in paths:
            while path:
                if path in self.lines:
                    return self.lines[path]
                path = path.rpartition(".")[0]
        return 1


# Strings as `"[^"\\]*(?:\\.[^"\\]*)*"`: a run of plain characters is one step of the regex
# engine, so a long string costs no memory (one alternation per character cost ~120 bytes each).
_TOKEN = re.compile(r'#[^\n]*|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\\\n]*(?:\\.[^\'\\\n]*)*\'|[\w.+\-]+|\S')


def field_lines(text, descriptor):
    """{field path → line} for every field set in `text` (already known to parse), with paths in
    FindInitializationErrors' syntax: `neuralnet.layer[3].innerproduct_conf.num_output`;
    repeated scalars map the field path without index to their first line."""
    toks, line, pos = [], 1, 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        if m.group()[0] != "#":
            toks.append((m.group(), line))
    lines = {}
    stack = [("", descriptor, collections.Counter())]
    i = 0
    while i < len(toks):
        tok, line = toks[i]
        i += 1
        if tok in "}>":
            stack.pop()
            continue
        if tok in ",;":
            continue
        if tok == "[":  # extension name: [pkg.name]
            while toks[i][0] != "]":
                tok += toks[i][0]
                i += 1
            tok += "]"
            i += 1
        prefix, desc, counts = stack[-1]
        field = desc.fields_by_name.get(tok) if desc is not None else None
        path = prefix + tok
        if field is not None and field.is_repeated and (
                field.type == FieldDescriptor.TYPE_MESSAGE):
            path += f"[{counts[tok]}]"
            counts[tok] += 1
        lines.setdefault(path, line)
        if toks[i][0] == ":":
            i += 1
        if toks[i][0] in "{<":
            i += 1
            sub = field.message_type if field is not None else None
            stack.append((path + ".", sub, collections.Counter()))
        elif toks[i][0] == "[":  # list value [a, b, ...]
            while toks[i][0] != "]":
                i += 1
            i += 1
        else:
            i += 1
            while i < len(toks) and toks[i - 1][0][0] in "\"'" and toks[i][0][0] in "\"'":
                i += 1  # adjacent strings concatenate
    return lines

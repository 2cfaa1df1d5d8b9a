"""singa.job.textproto: a conf's text parsed with line numbers; every parse error, unknown field or
value is one line `file:line: what`, found past comments and strings."""
import os
import tracemalloc

import pytest

from conf_helpers import GOOD, expect_error, line_of, load_error
from singa.errors import ConfigError
from singa.job import config


def test_error_message_is_one_line_with_file_and_line(tmp_path):
    msg, path = load_error(tmp_path, GOOD.replace("  alg: kBP\n", "  alg: kBP\n  alg: kNope\n"))
    file, line, what = msg.split(":", 2)
    assert file == path and os.path.basename(path) == "job.conf"
    assert int(line) == 6 and "kNope" in what and "\n" not in msg


def test_unknown_field(tmp_path):
    expect_error(tmp_path, GOOD.replace("test_steps: 2", "checkpoint_frequency: 2"),
            "checkpoint_frequency", 'no field named "checkpoint_frequency"')


def test_unknown_enum_value_without_parser_noise(tmp_path):
    msg, path = load_error(tmp_path, GOOD.replace("kSoftmaxLoss", "kTanh"))
    assert msg == f'{path}:{line_of(GOOD, "kSoftmaxLoss")}: Enum type "singa.LayerType" has no value named kTanh.'


def test_syntax_error(tmp_path):
    expect_error(tmp_path, GOOD.replace('name: "t"\n', 'name: "t\n', 1), 'name: "t', "missing ending quote")


def test_missing_file():
    with pytest.raises(ConfigError, match=r"^/nonexistent/job.conf: cannot read: No such file"):
        config.load_job("/nonexistent/job.conf")


def test_lines_found_past_comments_and_braces_in_strings(tmp_path):
    text = GOOD.replace("neuralnet {\n", 'neuralnet {\n  # a comment { layer { name: "x" }\n')
    text = text.replace('name: "t"', 'name: "t { # }"')
    text = text.replace('srclayers: "fc"', 'srclayers: "nope"')
    expect_error(tmp_path, text, '"nope"', "srclayer 'nope' names no layer", check_layers=False)


def test_a_long_string_costs_memory_in_proportion(tmp_path):
    text = GOOD.replace('name: "t"', 'name: "t"\ncheckpoint_path: "' + "a" * 2_000_000 + '"')
    tracemalloc.start()
    try:
        job = config.parse_job(text, check_paths=False, check_layers=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(job.checkpoint_path[0]) == 2_000_000
    assert peak < 20 * len(text), f"{peak / 1e6:.0f} MB to parse {len(text) / 1e6:.0f} MB"

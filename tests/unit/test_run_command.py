"""errors.run_command: how a script reports what stopped it."""
from singa.errors import ClusterError, DataError, run_command


def test_a_script_exits_with_the_errors_code_and_its_one_line(capsys):
    def fails(kind, text):
        raise kind(text)

    assert run_command(lambda: None) == 0
    assert run_command(fails, DataError, "x.bin: no such kvfile") == 2
    assert capsys.readouterr().err == "x.bin: no such kvfile\n"
    assert run_command(fails, ClusterError, "host h: unreachable") == 1
    assert run_command(fails, KeyboardInterrupt, "") == 130

"""Output checks that read like IREE's tests: --expect is a substring of one line; check files
with their own prefixes."""

from __future__ import annotations

import pytest
from conftest import assert_clean_error

from pyree_build.actions import checks
from pyree_build.core.errors import PyreeError

OUTPUT = "EXEC @mlp\n[Plugin]: M = 8, N = 8, K = 8\nresult[0]: hal.buffer_view\n8xf32=12 12 12\n"


def test_expect_is_a_substring_of_one_line():
    checks.check_expected(OUTPUT, ["M = 8, N = 8", "8xf32=12  12", "K = 8"], source="m.vmfb")
    with pytest.raises(PyreeError) as err:
        checks.check_expected(OUTPUT, ["K = 8 result[0]"], source="m.vmfb")  # spans two lines
    assert "within one output line" in err.value.details


def test_check_prefixes_select_the_lines(cli, system_plugin, system_module, tmp_path):
    check = tmp_path / "expected.txt"
    check.write_text("// CHECK-LABEL: EXEC @mixed_invocation\n// CHECK-SYSTEM: 8xf32=12 12 12 12 12 12 12 12\n// CHECK-OTHER: 8xf32=99\n")
    args = [
        "run",
        system_module,
        "--function",
        "mixed_invocation",
        "--input",
        "8xf32=2",
        "--input",
        "8xf32=4",
        "--plugin",
        system_plugin,
        "--check-file",
        check,
    ]
    ok = cli(*args, "--check-prefix", "CHECK", "--check-prefix", "CHECK-SYSTEM")
    assert ok.returncode == 0, ok
    assert_clean_error(cli(*args, "--check-prefix", "CHECK-OTHER"), "does not match the CHECK lines", "8xf32=99")
    assert_clean_error(cli(*args, "--check-prefix", "CHECK-NONE"), "no check lines with prefix CHECK-NONE")
    no_file = cli("run", system_module, "--function", "mixed_invocation", "--check-prefix", "CHECK")
    assert_clean_error(no_file, "--check-prefix selects lines of a --check-file")

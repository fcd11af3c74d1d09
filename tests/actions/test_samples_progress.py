"""`samples` shows progress while it works: ninja's [n/N] lines (one updating line on a
terminal), each test as it finishes, and still the table at the end."""

from __future__ import annotations

import io

import pytest

from pyree_build.actions.sample_runner import Progress
from pyree_build.core import echo

NINJA = ["[1/3] pyree_build: system plugin a", "[2/3] pyree_build: iree-compile b", "[3/3] pyree_build: compile c"]
TEST = "1/2 Test #1: plugin.system ......   Passed    0.12 sec"


@pytest.fixture(autouse=True)
def default_verbosity():
    before = echo.VERBOSITY
    echo.set_verbosity(1)
    yield
    echo.set_verbosity(before)


def test_on_a_terminal_ninja_lines_update_one_line():
    out = io.StringIO()
    progress = Progress(out, tty=True)
    for line in [*NINJA, "some compiler chatter", TEST]:
        progress.line(line)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1, repr(text)  # only the test result is a line of its own
    assert "\r  [3/3] pyree_build: compile c" in text and text.index("[3/3]") < text.index("Test #1")
    assert "chatter" not in text
    progress.line(NINJA[0])
    progress.close()
    assert out.getvalue().endswith("\r" + " " * len("  " + NINJA[0]) + "\r")  # cleared for what follows


def test_elsewhere_each_ninja_line_is_a_plain_line():
    out = io.StringIO()
    progress = Progress(out, tty=False)
    for line in [*NINJA, TEST]:
        progress.line(line)
    progress.close()
    assert out.getvalue().splitlines() == [f"  {line}" for line in NINJA] + [f"  {TEST}"]
    assert "\r" not in out.getvalue()


def test_quiet_shows_nothing_and_verbose_everything():
    out = io.StringIO()
    echo.set_verbosity(0)
    Progress(out, tty=False).line(NINJA[0])
    assert out.getvalue() == ""
    echo.set_verbosity(2)
    Progress(out, tty=False).line("-- Configuring done")
    assert out.getvalue() == "# -- Configuring done\n"


@pytest.mark.slow
def test_samples_streams_build_and_test_lines_before_the_table(cli, tmp_path):
    result = cli("samples", "--build-dir", tmp_path / "b", "-R", "plugin", timeout=1200)
    assert result.returncode == 0, result
    err = result.stderr
    first_ninja, build_done = err.index("  [1/"), err.index("  build iree-sample-deps (")
    assert first_ninja < build_done, err  # printed as ninja ran, not after
    tests = [line for line in err.splitlines() if " Test " in line and "#" in line]
    assert tests and all("Passed" in t or "Skipped" in t or "Not Run" in t for t in tests), err
    assert err.index(tests[-1]) < err.index("  ctest ("), err
    assert "sample" in result.stdout and "passed" in result.stdout  # the table


def test_the_table_fits_its_width_and_keeps_every_word_of_a_long_result():
    """issue 26 item 15: a skip's reason made the table 168 columns wide."""
    from pyree_build.actions.sample_runner import TestRow, format_table

    reason = "skipped: no usable CUDA GPU: no CUDA driver (libcuda.so) on this machine; install the NVIDIA driver to run it"
    rows = [TestRow("custom_dispatch/cuda/kernels", "cuda_kernels_run", reason, 0.01), TestRow("custom_dispatch/cpu/plugin", "plugin_run", "passed", 0.12)]
    table = format_table(rows, width=80)
    assert all(len(line) <= 80 for line in table.splitlines()), table
    lines = table.splitlines()
    column = lines[0].index("result")
    first_row = [lines[2][: lines[0].index("time")], *(line for line in lines[3:] if line.startswith(" " * column))]
    assert " ".join(line[column:].strip() for line in first_row) == reason
    assert table.splitlines()[0].split() == ["sample", "test", "result", "time"]

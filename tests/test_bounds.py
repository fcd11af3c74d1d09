"""Issue 35: one bound for a whole command. `run --timeout N` bounds everything the run does,
the import check that asks each plugin's resolve in a child included; real tools throughout."""

from __future__ import annotations

import subprocess

from conftest import PLUGIN_SAMPLE, assert_clean_error, run_cli

RUN_ARGS = ["--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4"]


def _spinning_resolve(tmp_path):
    anchor = "  ++state->resolve_calls;\n"
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text()
    assert anchor in text
    src = tmp_path / "spin.c"
    src.write_text(text.replace(anchor, anchor + "  for (;;) {}\n"))
    so = tmp_path / "spin.so"
    built = run_cli("plugin", src, "-o", so)
    assert built.returncode == 0, built
    return so


def test_run_timeout_bounds_the_import_check_too(tmp_path, system_module):
    spinning = _spinning_resolve(tmp_path)
    try:  # the import check's own bound was 120 s: a run given 3 s must not take it
        result = run_cli("run", system_module, *RUN_ARGS, "--plugin", spinning, "--timeout", "3", timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("run --timeout 3 was still running after 60 s") from exc
    assert_clean_error(result, "asking its resolve did not return within 3 s, the command's time limit (--timeout)", "spin.so")

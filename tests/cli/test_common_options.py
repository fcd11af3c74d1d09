"""-v, -q and -j N are common to every verb, before or after it; a mistyped option shows the
verb's usage."""

from __future__ import annotations

from conftest import PLUGIN_SAMPLE, SAMPLES


def test_common_options_before_or_after_the_verb(cli, tmp_path):
    src = SAMPLES / "substitution" / "program.mlir"
    before = cli("-v", "-j", "2", "compile", src, "-o", tmp_path / "a.vmfb")
    assert before.returncode == 0 and "(cd " in before.stderr and "iree-compile" in before.stderr, before
    after = cli("compile", "-j", "2", src, "-o", tmp_path / "b.vmfb", "-q")
    assert after.returncode == 0 and after.stderr == "", after
    assert (tmp_path / "a.vmfb").read_bytes() == (tmp_path / "b.vmfb").read_bytes()


def test_verbose_before_the_verb_is_not_reset_by_the_verb(cli, tmp_path):
    result = cli("-v", "fatelf", "list", tmp_path / "missing.sos")
    assert result.returncode != 0 and "usage:" not in result.stderr, result


def test_jobs_must_be_at_least_one(cli, tmp_path):
    for args in (("-j", "0", "doctor"), ("samples", "-j", "0"), ("plugin", "x.c", "-o", "x.so", "-j", "-3")):
        result = cli(*args)
        assert result.returncode == 2 and "must be at least 1" in result.stderr, result
    result = cli("objects", "x.c", "--arch", "x86_64", "-o", tmp_path, "-j", "two")
    assert result.returncode == 2 and "'two' is not a whole number of jobs" in result.stderr, result


def test_a_mistyped_option_shows_the_verbs_usage(cli, tmp_path):
    result = cli("compile", "x.mlir", "-o", tmp_path / "x.vmfb", "--bogus")
    assert result.returncode == 2, result
    assert result.stderr.startswith("usage: pyree-build compile "), result.stderr
    assert "pyree-build compile: error: unrecognized arguments: --bogus" in result.stderr
    result = cli("fatelf", "list", "a.sos", "--bogus")
    assert "usage: pyree-build fatelf list " in result.stderr and "unrecognized arguments: --bogus" in result.stderr


def test_quiet_run_prints_nothing_but_still_checks(cli, system_module, system_plugin):
    args = ("run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4", "--plugin", system_plugin)
    loud = cli(*args)
    assert loud.returncode == 0 and "8xf32=12" in loud.stdout, loud
    quiet = cli("-q", *args, "--expect", "8xf32=12 12 12 12 12 12 12 12")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == "", quiet
    wrong = cli(*args, "-q", "--expect", "8xf32=13")
    assert wrong.returncode != 0 and "output does not match" in wrong.stderr, wrong


def test_jobs_one_builds_the_same_plugin(cli, tmp_path):
    src = PLUGIN_SAMPLE / "standalone_plugin.c"
    one = cli("plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", src, "-o", tmp_path / "a.sos", "-j", "1")
    assert one.returncode == 0, one
    two = cli("-j", "2", "plugin", "--kind", "standalone", "--arch", "x86_64", "--arch", "aarch64", src, "-o", tmp_path / "b.sos")
    assert two.returncode == 0, two
    assert (tmp_path / "a.sos").read_bytes() == (tmp_path / "b.sos").read_bytes()


def test_a_system_plugin_of_several_sources_compiles_them_with_jobs(cli, tmp_path):
    (tmp_path / "helper.c").write_text("float docs16_helper(float x) { return 2.0f * x; }\n")
    src = PLUGIN_SAMPLE / "system_plugin.c"
    for jobs in ("1", "2"):
        result = cli("plugin", src, tmp_path / "helper.c", "-o", tmp_path / f"p{jobs}.so", "-j", jobs, "-D", f"JOBS_{jobs}")
        assert result.returncode == 0 and "compile 2 source(s)" in result.stderr, result
    assert (tmp_path / "p1.so").stat().st_size > 0 and (tmp_path / "p2.so").stat().st_size > 0

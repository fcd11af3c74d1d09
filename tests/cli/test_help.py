"""`--help` teaches: every verb (nested ones too) has a description, examples and help for
every option, with defaults shown. An option added without help fails here."""

from __future__ import annotations

import argparse

import pytest

from pyree_build.cli import _parsers, build_parser

PARSERS = _parsers(build_parser())


@pytest.mark.parametrize("name,parser", PARSERS, ids=[n or "top" for n, _ in PARSERS])
def test_every_verb_has_a_description_an_example_and_documented_options(name, parser):
    text = parser.format_help()
    assert parser.description and len(parser.description.split()) >= 8, f"{name!r} has no description paragraph"
    assert "examples:\n  pyree-build" in text, f"{name!r} has no example"
    undocumented = [a.option_strings or [a.dest] for a in parser._actions if not (a.help and a.help.strip())]
    assert not undocumented, f"{name!r}: options without help: {undocumented} (add help= or an entry in help_text.OPTIONS)"


def test_every_verb_takes_the_common_options():
    for name, parser in PARSERS:
        flags = {s for a in parser._actions for s in a.option_strings}
        assert {"-v", "-q", "-j", "--verbose", "--quiet", "--jobs"} <= flags, name


def test_defaults_are_shown(cli):
    assert "(default: system)" in cli("plugin", "--help").stdout
    run_help = cli("run", "--help").stdout
    assert "(default: local-sync)" in run_help
    assert "(default: llvm-cpu)" in cli("compile", "--help").stdout
    # Flags and empty lists have nothing to show.
    assert "(default: False)" not in run_help and "(default: [])" not in run_help and "(default: None)" not in run_help


def test_compile_usage_shows_the_flags_after_double_dash(cli):
    usage = cli("compile", "--help").stdout.split("\n\n")[0]
    assert usage.rstrip().endswith("[-- IREE_FLAGS...]"), usage


def test_examples_keep_their_line_breaks():
    (plugin,) = [p for n, p in PARSERS if n == "plugin"]
    lines = plugin.format_help().split("examples:\n", 1)[1].splitlines()
    assert all(line.startswith("  pyree-build plugin ") for line in lines if line.strip()), lines
    assert isinstance(plugin.formatter_class(prog="x"), argparse.RawDescriptionHelpFormatter)

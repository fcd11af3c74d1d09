"""`pyree-build <verb>`: parses arguments, runs one verb, prints, sets the exit code.

The parsers are built from Verb declarations (cli/parser.py: the core verbs of cli/verbs.py
and the backends' from the registry); cli/commands.py says what each verb runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from pyree_build.cli.commands import dispatch
from pyree_build.cli.parser import _parsers, build_parser, named_verb, needs_installed_backends, parser_for, verb_parser
from pyree_build.core import echo, files, native_client, processes, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import cmake_dir

__all__ = ["SKIP_EXIT_CODE", "_parsers", "build_parser", "cmake_dir", "main"]

SKIP_EXIT_CODE = 77  # actions.run.SKIP_EXIT_CODE, without importing it for every verb

# The names tests and tools used before the CLI was split into modules.
_named_verb = named_verb
_verb_parser = verb_parser


def _parse(args: list[str], extra: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Only the named verb's parser is built (the full one for help, or a word that is no verb,
    so the error lists every verb)."""
    named = named_verb(args)
    parser = parser_for(named, named is None or needs_installed_backends(args))
    if named and not any(isinstance(a, argparse._SubParsersAction) and a.choices for a in parser._actions):
        parser = parser_for(None, True)
    ns, unknown = parser.parse_known_args(args)
    if unknown:
        verb_parser(parser, ns).error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.extra = extra
    return parser, ns


def _run(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    if ns.cmake_dir:
        print(cmake_dir())
        return 0
    if ns.include_dir:
        print(toolchain.include_dir())
        return 0
    if ns.native_client:
        print(native_client.build(ns.native_client))
        return 0
    if not ns.verb:
        build_parser().print_help()
        return 2
    if ns.extra and ns.verb not in ("compile", "dump"):
        parser.error("arguments after -- are passed to iree-compile, so only `compile` and `dump` take them")
    echo.set_verbosity(2 if ns.verbose else 0 if ns.quiet else 1)
    # SIGINT/SIGTERM end every tool started (its whole process group) and unwind, so
    # temporaries are removed; then the exit code says which signal stopped us.
    with processes.stop_on_signals(), files.command_scope():  # a failed verb leaves no directory it made
        code = dispatch(ns)
    sys.stdout.flush()  # here, so a reader that went away is seen while it can be handled
    return int(code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser, ns = _parse(args, extra)
    ns.command_line = args if not extra else None  # what a plan for the native client is for (run_command)
    try:
        return _run(parser, ns)
    except PyreeError as err:
        text = err.render()
        if err.exit_code == SKIP_EXIT_CODE:
            text = text.removeprefix("error: ")  # a skip (ctest's SKIP_RETURN_CODE) is not an error
        print(text, file=sys.stderr)
        return err.exit_code
    except processes.Stopped as stop:
        print(f"stopped by {stop}: every tool pyree_build started was ended", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """The reader of stdout stopped (`... | head`): stop quietly, as other command-line tools do."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

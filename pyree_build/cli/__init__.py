"""`pyree-build <verb>`: parses arguments, runs one verb, prints, sets the exit code.

The parsers are built from Verb declarations (cli/parser.py: the core verbs of cli/verbs.py
and the backends' from the registry); cli/commands.py says what each verb runs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from pyree_build.cli.commands import dispatch
from pyree_build.cli.parser import _parsers, build_parser, named_verb, needs_installed_backends, parser_for, verb_parser
from pyree_build.client import native
from pyree_build.core import echo, files, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import cmake_dir

__all__ = ["SKIP_EXIT_CODE", "_parsers", "build_parser", "cmake_dir", "main"]

resource = lazy.module("resource")  # only where a write was refused

SKIP_EXIT_CODE = 77  # actions.run.SKIP_EXIT_CODE, without importing it for every verb

# The names tests and tools used before the CLI was split into modules.
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
        print(native.build(ns.native_client))
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
    return int(code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    try:
        with _named_output():
            try:
                parser, ns = _parse(args, extra)
                ns.command_line = args if not extra else None  # what a plan for the native client is for (run_command)
                return _run(parser, ns)
            finally:  # here, so a reader that went away or a refused write is seen while it can be handled (also after --help)
                sys.stdout.flush()
    except PyreeError as err:
        text = err.render()
        if err.exit_code == SKIP_EXIT_CODE:
            text = text.removeprefix("error: ")  # a skip (ctest's SKIP_RETURN_CODE) is not an error
        _say(text)
        return err.exit_code
    except processes.Stopped as stop:
        _say(f"stopped by {stop}: every tool pyree_build started was ended")
        return stop.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except OSError as err:  # the system refused a read or a write no step expected to fail (a temporary directory under `ulimit -f`)
        _say(PyreeError(err.strerror or str(err), file=err.filename, fix=_system_fix(err)).render())
        return 1


def _say(text: str) -> None:
    """The command's last words on stderr; where stderr cannot take them, the exit code alone."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _system_fix(err: OSError) -> str:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if err.errno == errno.EFBIG or limit != resource.RLIM_INFINITY:
        return f"the file size limit (`ulimit -f`) is {limit} bytes: raise it (`ulimit -f unlimited`)"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that file system (or raise the quota), or send the output elsewhere"
    return "check that it can be written (permissions, a device that takes writes)"


class _NamedStream:
    """sys.stdout or sys.stderr while a verb runs: a write or flush the system refuses (a full
    disk, /dev/full, `ulimit -f`) raises a PyreeError naming the stream, so no verb exits 0 with
    its output lost, nor with a traceback. A reader that went away (BrokenPipeError) stays as
    it is: the CLI stops quietly then."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._lost(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._lost(err) from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    def _lost(self, err: OSError) -> PyreeError:
        where = ""
        with contextlib.suppress(OSError, ValueError):
            fd = self._stream.fileno()
            where = f" ({os.readlink(f'/proc/self/fd/{fd}')})" if os.path.isdir("/proc/self/fd") else ""
            # What is still buffered would fail again at exit, with Python's own report.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        return PyreeError(f"cannot write to {self._name}{where}: {err.strerror or err}", fix=_system_fix(err))


@contextlib.contextmanager
def _named_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout = _NamedStream(sys.stdout, "standard output")
    sys.stderr = _NamedStream(sys.stderr, "standard error")
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _reader_went_away() -> int:
    """The reader of stdout stopped (`... | head`): stop quietly, as other command-line tools do."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The argparse parsers, built from Verb declarations: the core verbs' (cli/verbs.py) and the
backends' (the registry), by one code path, with the help of cli/help_text.py attached."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
from collections.abc import Sequence

from pyree_build import backends
from pyree_build.backends.base import Option, Verb
from pyree_build.cli import help_text
from pyree_build.cli.verbs import CORE_VERBS, TAKE_COMPILE_OPTIONS, TOP_DESCRIPTION, TOP_EXAMPLES, Registered
from pyree_build.core.package import __version__


def _jobs(text: str) -> int:
    """-j N: a whole number of at least 1 (argparse reports anything else as a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of jobs") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} jobs: must be at least 1 (or leave -j out to use every core)")
    return value


def _add_common_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-v, -q, -j N on the top-level parser and on every verb, so they go before or after it.

    The verbs' copies default to SUPPRESS: left out after the verb, they keep what was given
    before it instead of resetting it.
    """
    keep = {} if top else {"default": argparse.SUPPRESS}
    group = parser.add_argument_group("common options")
    options = (
        (("-v", "--verbose"), dict(action="store_true", help="print every tool command, ready to paste into a shell")),
        (("-q", "--quiet"), dict(action="store_true", help="print only errors (no step lines, no program output or table)")),
        (("-j", "--jobs"), dict(type=_jobs, metavar="N", help="parallel jobs for independent steps (default: the number of cores)")),
    )
    for flags, kwargs in options:
        if not any(f in parser._option_string_actions for f in flags):
            group.add_argument(*flags, **kwargs, **({"default": False if kwargs.get("action") else None} if top else keep))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' line breaks, shows each option's default, and the usage tail main() parses."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if action.option_strings and default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)

    def _format_usage(self, usage, actions, groups, prefix) -> str:  # type: ignore[no-untyped-def]
        text = super()._format_usage(usage, actions, groups, prefix)
        tail = help_text.USAGE_TAIL.get(self._prog.split(" ", 1)[1] if " " in self._prog else "")
        return text.rstrip("\n") + f" {tail}\n\n" if tail else text


def _parsers(parser: argparse.ArgumentParser, name: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser: the top level (""), each verb, and nested verbs ("fatelf join")."""
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                found += _parsers(sub, f"{name} {verb}".strip())
    return found


def _epilog(examples: str) -> str | None:
    return "examples:\n" + "\n".join("  " + line for line in examples.splitlines()) if examples else None


def _finish(parser: argparse.ArgumentParser) -> None:
    """Give every parser the common options, the help formatter, and the help of options
    declared without one (help_text.OPTIONS)."""
    for name, p in _parsers(parser):
        _add_common_options(p, top=not name)
        p.formatter_class = _HelpFormatter
        for action in p._actions:
            if not action.help and action.dest not in ("help", "version"):
                action.help = help_text.option_help(name, action.dest)


def _add_option(parser: argparse.ArgumentParser, option: Option) -> None:
    kwargs = dict(option.kwargs)
    choices = kwargs.get("choices")
    if isinstance(choices, Registered):
        del kwargs["choices"]  # set after: argparse lists choices when adding, which would read them all
    action = parser.add_argument(*option.flags, **kwargs)
    if isinstance(choices, Registered):
        action.choices = choices


def _add_verb(sub: argparse._SubParsersAction[argparse.ArgumentParser], verb: Verb, extra: Sequence[Option] = ()) -> None:
    """One verb's parser (and its sub-verbs'), from its declaration; `extra`: backends' options."""
    p = sub.add_parser(verb.name, help=verb.help, description=verb.description or None, epilog=_epilog(verb.examples))
    p.set_defaults(declared_verb=verb)
    for option in (*verb.options, *extra):
        _add_option(p, option)
    if verb.actions:
        nested = p.add_subparsers(dest="action", metavar="ACTION", required=True)
        for action in verb.actions:
            _add_verb(nested, action)


def compile_options(external: bool, *, dumping: bool = False) -> list[Option]:
    """Every backend's compile options (with `dumping`, those of backends `dump` supports),
    once per dest (the first backend declaring it wins)."""
    found: dict[str, Option] = {}
    for backend in backends.every() if external else backends.builtin():
        if dumping and not backend.dumps:
            continue
        for option in backend.compile_options:
            found.setdefault(option.dest, option)
    return list(found.values())


def _declared(verb: str | None, external: bool) -> list[Verb]:
    """The verbs a parser needs: all (None), the one named, or none ("": --version and alike)."""
    if verb is None:
        return [*(v for b in (backends.every() if external else backends.builtin()) for v in b.verbs), *CORE_VERBS.values()]
    if verb in CORE_VERBS:
        return [CORE_VERBS[verb]]
    found = backends.find_verb(verb) if verb else None
    return [found[1]] if found else []


def build_parser(verb: str | None = None, *, external: bool | None = None) -> argparse.ArgumentParser:
    """The command-line parser; with `verb`, only that verb's parser is built under the top level
    ("": none); the top level's --help and its list of verbs need them all: build_parser().

    `external`: whether backends installed by other packages are read for the parsers' options
    (default: for the full parser only; choices of targets and devices read them when needed).
    """
    external = verb is None if external is None else external
    parser = argparse.ArgumentParser(prog="pyree-build", description=TOP_DESCRIPTION, epilog=_epilog(TOP_EXAMPLES))
    parser.add_argument("--version", action="version", version=f"pyree_build {__version__}")
    parser.add_argument("--cmake-dir", action="store_true", help="print the directory holding pyree_buildConfig.cmake and exit")
    parser.add_argument("--include-dir", action="store_true", help="print the directory holding iree/hal/local/executable_plugin.h and exit")
    parser.add_argument("--native-client", metavar="DIR", help="build the native pyree-build client (what CMake runs) into DIR, print its path and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for declared in _declared(verb, external):
        _add_verb(sub, declared, compile_options(external, dumping=declared.name == "dump") if declared.name in TAKE_COMPILE_OPTIONS else ())
    _finish(parser)
    return parser


@functools.cache
def parser_for(verb: str | None, external: bool) -> argparse.ArgumentParser:
    """build_parser's parser, built once a process: parsing a command line leaves it unchanged,
    and a server's worker then finds it built (warm_up)."""
    return build_parser(verb, external=external)


def warm_up() -> None:
    """The server builds each verb's parser (and --version's) before it forks its workers, and
    parses a few made-up command lines with each: argparse matches arguments with regular
    expressions it compiles on first use (~0.2 ms of a fresh worker's `run`), which are then
    in the re module's cache every worker inherits."""
    for verb in ("", *CORE_VERBS, *(v.name for b in backends.builtin() for v in b.verbs)):
        parser = parser_for(verb, False)
        for words in ([verb], [verb, "x"], [verb, "x", "y", "--z", "1"]):
            with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_known_args([w for w in words if w])


def verb_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser the command line chose, so its error shows that verb's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return verb_parser(chosen, ns)
    return parser


def named_verb(args: Sequence[str]) -> str | None:
    """The verb a command line names (its first word that is no option nor -j's value); "" when
    it names none (--version: no verb's parser is needed); None for help (every verb is listed)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-j", "--jobs", "--native-client"):
            skip = True
        elif arg in ("-h", "--help"):
            return None
        elif not arg.startswith("-"):
            return arg
    return ""


def needs_installed_backends(args: Sequence[str]) -> bool:
    """Whether the parser must read the backends other packages install: for help (their
    options are listed), or a `--target` that is not built in (its options are parsed)."""
    if "-h" in args or "--help" in args:
        return True
    values = [b for a, b in zip(args, args[1:]) if a == "--target"] + [a.partition("=")[2] for a in args if a.startswith("--target=")]
    return any(value not in backends.names(external=False) for value in values)

"""Options several backends' verbs share, declared once."""

from __future__ import annotations

from pyree_build.backends.base import Option
from pyree_build.core.toolchain import C_COMPILERS

# -I, -D and --depfile mean the same to every verb that compiles a source.
SOURCE_OPTIONS = (
    Option(("-I",), {"dest": "include_dirs", "action": "append", "default": [], "metavar": "DIR", "help": "add an include directory (repeatable)"}),
    Option(("-D",), {"dest": "defines", "action": "append", "default": [], "metavar": "NAME[=VALUE]", "help": "define a macro (repeatable)"}),
    Option(("--depfile",), {"help": "also write a Make/Ninja depfile listing every input (for CMake's DEPFILE)"}),
)


def plugin_option(help_text: str) -> Option:
    """--plugin PATH, repeatable: a plugin the verb's module loads (the `plugins` argument)."""
    return Option(("--plugin",), {"dest": "plugins", "action": "append", "default": [], "metavar": "PATH", "help": help_text})


C_OPTIONS = (
    Option(("--cc",), {"default": "zig", "choices": C_COMPILERS, "help": "C compiler (default: zig, the ziglang wheel's clang)"}),
    *SOURCE_OPTIONS,
)

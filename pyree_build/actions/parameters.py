"""A program's weights kept out of its text, and put back into its module at compile time.

`import` writes an ONNX model's large weights (each of PARAM_ELEMENTS_THRESHOLD elements or more)
to an archive beside the MLIR, `<stem>_params.irpa`, and the program's globals name them
(`util.global private @W1 = #flow.parameter.named<"model"::"W1"> : tensor<...>`): at model size
(VGG-19: 575 MB of weights) weights printed as MLIR text made the import take minutes and every
later step parse hundreds of MB again. `compile` then imports every parameter the program names
back into the module (iree-compile's --iree-parameter-import, for any size), so a .vmfb stays
self-contained: run, verify, bench, tune and ctest never need the archive.

The archive is found beside the program (ARCHIVE_SUFFIX), named by a flag, so it is an input of
the compile (its content keyed, listed in the depfile): an edited archive rebuilds the module.

IREE 3.13's importer writes the globals as `#stream.parameter.named`, a form its compile-time
import skips (it reads `#flow.parameter.named`, the input form); `import` writes the flow form.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from pyree_build.core import echo, processes, readers, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import record

# The scope the import names its parameters in, and the archive it writes beside OUT.mlir.
SCOPE = "model"
ARCHIVE_SUFFIX = "_params.irpa"
# Initializers of at least this many elements are externalized (iree-import-onnx's default,
# passed explicitly so that a change of that default changes nothing here).
PARAM_ELEMENTS_THRESHOLD = 100
# Every parameter is imported whatever its size (0 would import none but those named by key).
_MAXIMUM_SIZE = 2**63 - 1
# A flag of the caller's that imports parameters: then the caller chose what is imported.
_CALLER_IMPORTS = "--iree-parameter-import"

_NAMED = re.compile(r'#(?P<dialect>flow|stream)\.parameter\.named<(?:"(?P<scope>(?:[^"\\]|\\.)*)"::)?"(?P<key>(?:[^"\\]|\\.)*)"')
_STREAM_GLOBAL = re.compile(r"^(\s*util\.global\b[^\n]*?=\s*)#stream\.parameter\.named<", re.MULTILINE)
# The runtime module a module calls to load parameters: a module that names it needs an archive.
_PARAMETERS_MODULE = struct.pack("<I", len(b"io_parameters")) + b"io_parameters\0"


@record(frozen=True)
class Parameter:
    dialect: str  # flow or stream
    scope: str
    key: str


def archive_for(program: Path) -> Path:
    """Where `import` writes the weights of `program` (OUT.mlir -> OUT_params.irpa)."""
    return program.with_name(program.stem + ARCHIVE_SUFFIX)


def named(text: str) -> list[Parameter]:
    """The parameters `text` (MLIR) names, in order, each once."""
    if ".parameter.named<" not in text:  # a large inline program costs one substring search, not a regex scan
        return []
    return [Parameter(*k) for k in dict.fromkeys((m["dialect"], m["scope"] or "", m["key"]) for m in _NAMED.finditer(text))]


def flow_form(text: str) -> str:
    """`text` with each parameter global in the form IREE's compile-time import reads."""
    return _STREAM_GLOBAL.sub(r"\1#flow.parameter.named<", text)


def _shown(params: Sequence[Parameter], limit: int = 3) -> str:
    names = ", ".join(f"'{p.key}'" for p in params[:limit])
    return names + (f" and {len(params) - limit} more" if len(params) > limit else "")


def import_flags(source: Path, text: str, flags: Sequence[str] = ()) -> list[str]:
    """The iree-compile flags that import every parameter `source` names from its archive
    (archive_for), or [] when it names none or the caller's `flags` import parameters already.
    A PyreeError when the archive is missing or the globals are in a form IREE does not import."""
    params = named(text)
    if not params or any(f.startswith(_CALLER_IMPORTS) for f in flags):
        return []
    stream = [p for p in params if p.dialect == "stream"]
    if stream:
        raise PyreeError(
            f"the program's globals name {len(stream)} parameter(s) ({_shown(stream)}) as #stream.parameter.named, a form "
            f"iree-compile {toolchain.iree_compile().version} does not import at compile time: the module would need the "
            "weights' archive at run time, which run, verify, bench and tune never pass",
            file=source,
            fix="import the model with `pyree-build import` (it writes #flow.parameter.named, the form IREE imports), or replace "
            "#stream.parameter.named by #flow.parameter.named in the program",
        )
    archive = archive_for(source)
    problem = readers.problem(archive)
    if problem is not None:
        raise PyreeError(
            f"the program names {len(params)} parameter(s) ({_shown(params)}): weights kept out of its text, in an archive beside it, "
            + (f"and {archive.name} is not there" if problem == "not found" else f"and {archive.name} is {problem}, not a regular file"),
            file=source,
            details=f"looked for {archive}",
            fix=f"`pyree-build import` writes {archive.name} beside {source.name}: keep the two together (copy or move both), "
            "import the model again, or import it with --inline-params to keep its weights in the MLIR",
        )
    scopes = dict.fromkeys(p.scope for p in params)
    resolved = archive.resolve()
    return [*(f"--iree-parameter-import={f'{s}=' if s else ''}{resolved}" for s in scopes), f"--iree-parameter-import-maximum-size={_MAXIMUM_SIZE}"]


def archive_keys(archive: Path) -> list[str] | None:
    """The keys the archive holds (iree-dump-parameters), or None when it cannot be read."""
    try:
        tool = toolchain.iree_dump_parameters()
    except PyreeError:
        return None
    with echo.muted_commands():
        listing = processes.spawn(tool.command(f"--parameters={archive}"), what="reading the parameter archive", check=False, timeout=60)
    if listing.returncode != 0:
        return None
    return [m[1] for m in re.finditer(r"\|\s*`(.*)`\s*$", listing.stdout, re.MULTILINE)]


def require_self_contained(module: Path, source: Path, text: str) -> None:
    """A PyreeError unless the compiled `module` holds every weight (it calls no io_parameters)."""
    with open(module, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(_PARAMETERS_MODULE) < 0:
            return
    params = named(text)
    archive = archive_for(source)
    keys = archive_keys(archive)
    absent = [p for p in params if keys is not None and p.key not in keys]
    if absent:
        why = f"{archive.name} lacks {len(absent)} of them ({_shown(absent)}): it is not the archive this program was imported with"
        fix = f"import the model again (it writes {source.name} and {archive.name} together), or import it with --inline-params"
    else:
        why = "iree-compile imports only parameters of 8, 16, 32 and 64-bit elements (not i1 or i4 ones)"
        fix = "import the model with --inline-params, which keeps its weights in the MLIR"
    raise PyreeError(
        f"the module still reads weights from a parameter archive at run time: {why}",
        file=source,
        details=f"the program names {len(params)} parameter(s); {archive} holds " + (f"{len(keys)}" if keys is not None else "an unreadable index"),
        fix=fix,
    )

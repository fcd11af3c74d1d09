"""Argument checks at the Python API's boundary: a wrong type is a PyreeError naming the
argument, never a TypeError from deep inside, and a single path where a list is taken
is one path (never a string split into characters)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError, as_path
from pyree_build.core.errors import shown as _shown

if TYPE_CHECKING:
    import inspect
else:
    inspect = lazy.module("inspect")  # ~5 ms, and only a call through the Python API binds a signature

PathLike = str | os.PathLike[str]

# `value` as a Path: a str or os.PathLike, not empty (defined in errors, which needs it too).
path = as_path


# --- Import names ------------------------------------------------------------------
# An import's name becomes a function in the kernel's language, a symbol in the MLIR and a
# name in CMake: refused here, before anything is generated, when any of them cannot hold it.


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_C_KEYWORDS = _words(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "alignas alignof bool constexpr false nullptr static_assert thread_local true typeof typeof_unqual asm"
)
_CXX_KEYWORDS = _C_KEYWORDS | _words(
    "and and_eq bitand bitor catch char8_t char16_t char32_t class compl concept consteval constinit const_cast "
    "co_await co_return co_yield decltype delete dynamic_cast explicit export friend mutable namespace new "
    "noexcept not not_eq operator or or_eq private protected public reinterpret_cast requires static_cast template "
    "this throw try typeid typename using virtual wchar_t xor xor_eq"
)
_GLSL_KEYWORDS = _words(
    "const uniform buffer shared attribute varying coherent volatile restrict readonly writeonly atomic_uint "
    "layout centroid flat smooth noperspective patch sample invariant precise break continue do for while switch "
    "case default if else subroutine in out inout int void bool true false float double discard return uint struct "
    "lowp mediump highp precision common partition active asm class union enum typedef template this resource goto "
    "inline noinline public static extern external interface long short half fixed unsigned superp input output "
    "filter sizeof cast namespace using demote"
)
# GLSL's vector, matrix, sampler and image types, and the sized types its extensions add.
_GLSL_TYPE = re.compile(
    r"(?:[biud]|f16|f32|f64|i8|i16|i32|i64|u8|u16|u32|u64|h|f)?vec[234]|d?mat[234](?:x[234])?|f(?:16|32|64)?mat[234](?:x[234])?"
    r"|(?:float|int|uint)(?:8|16|32|64)_t|[iu]?(?:sampler|image|texture|subpassInput)\w*|sampler(?:Shadow)?"
)
_LANGUAGE_KEYWORDS = {"c": _C_KEYWORDS, "c++": _CXX_KEYWORDS, "glsl": _GLSL_KEYWORDS}


def import_name(name: object, language: str = "c", role: str = "import name") -> str:
    """`name` when it can name an import in `language` ("c", "c++" for CUDA and HIP, "glsl"):
    an ASCII C identifier that is no keyword, no reserved identifier (`__` anywhere, `_` and a
    capital first, GLSL's `gl_`), not `main` and not in IREE's namespace (`iree_`: the plugin
    ABI's own exports, such as iree_hal_executable_plugin_query)."""
    text = _shown(name)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise PyreeError(f"{role} {text} is not a C identifier", fix="use ASCII letters, digits and _, not starting with a digit (e.g. my_gemm)")
    why = None
    if name in _LANGUAGE_KEYWORDS[language] or (language == "glsl" and _GLSL_TYPE.fullmatch(name)):
        why = f"a keyword of {'GLSL' if language == 'glsl' else language.upper()}"
    elif "__" in name or re.match(r"_[A-Z]", name) or (language == "glsl" and name.startswith("gl_")):
        why = "reserved for the compiler and its library (`__` anywhere, `_` and a capital first" + (", `gl_` first)" if language == "glsl" else ")")
    elif name == "main":
        why = "the program's entry point"
    elif name.startswith("iree_"):
        why = "in IREE's namespace (iree_...: the plugin ABI's own functions, such as iree_hal_executable_plugin_query)"
    if why is not None:
        raise PyreeError(f"{role} {text} cannot name an import: it is {why}", fix=f"choose another name, e.g. my_{name.strip('_').lower() or 'kernel'}")
    return name


def optional_path(value: object, role: str) -> Path | None:
    return None if value is None else path(value, role)


def _items(value: object, role: str, what: str) -> list[object]:
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, (bytes, bytearray, dict)) or not isinstance(value, Iterable):
        raise PyreeError(
            f"{role} must be {what} or a list of them, got {type(value).__name__} {_shown(value)}",
            fix=f"pass {what}, or a list of them",
        )
    return list(value)


def paths(value: object, role: str) -> list[Path]:
    """One path or a list of paths, as a list (a single str is one path)."""
    return [path(v, role) for v in _items(value, role, "a path")]


def strings(value: object, role: str) -> list[str]:
    """One string or a list of strings (a single str is one item)."""
    items = _items(value, role, "a string")
    for v in items:
        if not isinstance(v, str):
            raise PyreeError(f"{role} must be strings, got {type(v).__name__} {_shown(v)}", fix=f"pass {role} as a list of strings")
    return [str(v) for v in items]


def words(value: object, role: str) -> list[str]:
    """One value or a list of values that are strings or ints (sms, archs): `80` is `[80]`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [str(value)]
    items = _items(value, role, "a string or an int")
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise PyreeError(f"{role} must be strings or ints, got {type(v).__name__} {_shown(v)}", fix=f"pass {role} as e.g. [80, 90]")
        out.append(str(v))
    return out


def choice(value: object, role: str, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise PyreeError(f"{role} must be one of {', '.join(choices)}, got {_shown(value)}", fix=f"pass {role}={choices[0]!r}, for example")
    return value


def text(value: object, role: str) -> str:
    if not isinstance(value, str) or not value:
        raise PyreeError(f"{role} must be a non-empty string, got {type(value).__name__} {_shown(value)}", fix=f"pass {role} as a string")
    return value


def optional_text(value: object, role: str) -> str | None:
    return None if value is None else text(value, role)


def jobs(value: object) -> int | None:
    """Parallel jobs: None (the number of cores) or an int of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PyreeError(f"jobs must be a whole number of at least 1, got {_shown(value)}", fix="pass -j 4, for example, or leave it out to use every core")
    return value


def count(value: object, role: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PyreeError(f"{role} must be a whole number of at least 1, got {_shown(value)}", fix=f"pass {role}=5, for example")
    return value


def flag(value: object, role: str) -> bool:
    if not isinstance(value, bool):
        raise PyreeError(f"{role} must be True or False, got {_shown(value)}", fix=f"pass {role}=True or {role}=False")
    return value


def _sm(value: object, role: str) -> str | int | None:
    if value is None or (isinstance(value, (str, int)) and not isinstance(value, bool)):
        return value
    raise PyreeError(f"{role} must be an sm such as 80 or 'sm_80', got {type(value).__name__} {_shown(value)}", fix=f"pass {role}=80, for example")


def _number(value: object, role: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise PyreeError(f"{role} must be a number of seconds, got {_shown(value)}", fix=f"pass {role}=0.1, for example")
    return value


def _tolerance(value: object, role: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise PyreeError(f"{role} must be a non-negative number, got {_shown(value)}", fix=f"pass {role}=1e-5, for example")
    return float(value)


def is_file_name(value: object) -> bool:
    """`value` names one file inside a directory: a non-empty string with no directory part, no
    NUL, not `.` or `..`, that the file system can encode. Joined to a directory it stays there."""
    if not isinstance(value, str) or value in ("", ".", "..") or any(c in value for c in "/\\\0"):
        return False
    try:
        os.fsencode(value)
    except UnicodeError:
        return False
    return True


def file_name(value: object, role: str) -> str:
    """A plain file name (see is_file_name), or the PyreeError that says why not."""
    if not is_file_name(value):
        raise PyreeError(
            f"{role} must be a plain file name (no directory part, no NUL, not '.' or '..'), got {type(value).__name__} {_shown(value)}",
            fix=f"pass {role} as one file name, e.g. 'kernel'",
        )
    assert isinstance(value, str)
    return value


def _source_texts(value: object, role: str) -> dict[str, str]:
    """Kernel sources by file name (`{"kernels.cu": "..."}`): plain names, text values."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(is_file_name(k) and isinstance(v, str) for k, v in value.items()):
        raise PyreeError(
            f"{role} must map file names (no directories, no NUL) to source text, got {type(value).__name__} {_shown(value)}",
            fix=f"pass {role}={{'kernels.cu': cuda_text}}, for example",
        )
    return dict(value)


def _group_numbers(value: object, role: str) -> list[int | tuple[int, ...]]:
    """Op group numbers as `ops` prints them: one or a sequence of whole numbers from 1, each
    of which may be a sequence of numbers itself (those groups merged into one kernel)."""

    def number(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    values = [value] if isinstance(value, int) else value
    if isinstance(values, (list, tuple)) and all(number(v) or (isinstance(v, (list, tuple)) and v and all(map(number, v))) for v in values):
        return [v if isinstance(v, int) else tuple(v) for v in values]
    raise PyreeError(
        f"{role} must be op group numbers (1, 2, ...) as `pyree-build ops` lists them, got {_shown(value)}",
        fix=f"pass {role}=[1], for example, or {role}=[(1, 2, 3)] to merge groups into one kernel",
    )


def _optional_count(value: object, role: str) -> int | None:
    return None if value is None else count(value, role)


def _seed(value: object, role: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PyreeError(f"{role} must be a non-negative whole number, got {_shown(value)}", fix=f"pass {role}=0, for example")
    return value


def _options(value: object, role: str) -> dict[str, object] | None:
    """A backend's options by dest: a mapping of names to values (or None: none)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise PyreeError(
            f"{role} must be a mapping of option names to values, got {type(value).__name__} {_shown(value)}", fix=f"pass {role}={{'cpu': 'host'}}, for example"
        )
    return dict(value)


def _one_source(value: object, role: str) -> Path:
    items = paths(value, role)
    if len(items) != 1:
        raise PyreeError(f"{role} takes one file, got {len(items)}", fix="call it once per source")
    return items[0]


# Each argument name the verbs use -> how it is checked (and normalised) at the API boundary.
# One table, so every verb checks the same name the same way; a name not listed passes as is.
CHECKS = {
    "sources": paths,
    "source": _one_source,
    "output": path,
    "output_dir": path,
    "module": path,
    "directory": path,
    "a": path,
    "b": path,
    "depfile": optional_path,
    "check_file": optional_path,
    "substitute_from": optional_path,
    "include_dirs": paths,
    "object_search_paths": paths,
    "plugins": paths,
    "defines": strings,
    "flags": strings,
    "allow_undefined": strings,
    "substitutions": strings,
    "expect": strings,
    "expect_imports": strings,
    "expect_close": strings,
    "rtol": _tolerance,
    "atol": _tolerance,
    "check_prefixes": strings,
    "link_bitcode": paths,
    "gfxs": words,
    "target_options": _options,
    "inputs": strings,
    "archs": words,
    "sms": words,
    "jobs": lambda v, _role: jobs(v),
    "device": text,
    "kind": text,
    "target": text,
    "cc": text,
    "compiler": text,
    "ptx_isa": text,
    "cpu": text,
    "function": text,
    "name": optional_text,
    "sm": _sm,
    "force": flag,
    "verify": flag,
    "skip_unavailable": flag,
    "repetitions": count,
    "rounds": count,
    "min_time": _number,
    "onnx_model": path,
    "data_dir": optional_path,
    "opset_version": _optional_count,
    "externalize_params": flag,
    "seed": _seed,
    "ops": _group_numbers,
    "dynamic": flag,
    "imports": strings,
    "onnx": optional_path,
    "mlir": text,
    "c_source": optional_text,
    "files": _source_texts,
    "build_dir": optional_path,
}


def checked_call(
    implementation: Callable[..., Any],
    positional: Sequence[Any],
    keywords: dict[str, Any],
    *,
    verb: str,
    optional: Sequence[str] = (),
    checked: Sequence[str] = (),
) -> Any:
    """Bind the caller's arguments to `implementation`'s signature, check each by its name
    (CHECKS), and call it: a wrong argument is a PyreeError naming it, never a TypeError.
    Names in `optional` may be None; names in `checked` the caller has checked already."""
    try:
        bound = inspect.signature(implementation).bind(*positional, **keywords)
    except TypeError as exc:
        raise PyreeError(f"pb.{verb}: {exc}", fix=f"see help(pyree_build.{verb}) for its arguments") from None
    for name, value in bound.arguments.items():
        check = CHECKS.get(name)
        if check is None or name in checked or (value is None and name in optional):
            continue
        bound.arguments[name] = check(value, name)
    return implementation(*bound.args, **bound.kwargs)

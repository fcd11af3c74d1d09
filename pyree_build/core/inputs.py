"""Every file an action will read, found before the tool runs.

The cache key and the depfile must name every file a tool reads, however it was named:
objects referenced from MLIR (`#hal.executable.object<{path = ...}>`, resolved as
iree-compile resolves them), files and directories named by pass-through flags, headers
named by `#include`. Where the inputs cannot be known (a flag naming a directory whose
reads are unknown, MLIR bytecode, an `#include` through a macro), the answer says why,
and the action is then not cached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from pyree_build.core.records import field, record

PathLike = str | os.PathLike[str]

MLIR_BYTECODE_MAGIC = b"ML\xefR"

# One MLIR token: a `//` comment, a string (escapes kept; possibly unterminated), an
# identifier with its sigil, the arrow of a function type, or any other single character.
_TOKEN = re.compile(
    r"(?P<comment>//[^\n]*)"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*"?)'
    r"|(?P<ident>[#!@%^]?[A-Za-z_][\w$.]*)"
    r"|(?P<arrow>->)"
    r"|(?P<punct>\S)"
)
_OPEN = {"<": ">", "{": "}", "[": "]", "(": ")"}
_CLOSE = set(_OPEN.values())


def _unescape(body: str) -> str:
    """The value of an MLIR string literal's body: `\\\\`, `\\"`, `\\n`, `\\t` and `\\HH` escapes."""
    if "\\" not in body:
        return body  # a weights blob (`"0x..."`, hundreds of MB inline) has none: no walk per character
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 >= len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in '\\"':
            out.append(nxt)
            i += 2
        elif nxt == "n":
            out.append("\n")
            i += 2
        elif nxt == "t":
            out.append("\t")
            i += 2
        elif re.fullmatch(r"[0-9A-Fa-f]{2}", body[i + 1 : i + 3]):
            out.append(chr(int(body[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "punct"
        if kind == "comment":
            continue
        value = m.group()
        if kind == "string":
            value = _unescape(value[1:-1] if value.endswith('"') and len(value) > 1 else value[1:])
        yield kind, value


def referenced_objects(mlir_text: str) -> list[str]:
    """Paths of the `#hal.executable.object`s an MLIR program references without `data`.

    Parsed by tokens, so comments and strings cannot hide or fake a reference.
    """
    if "#hal.executable.object" not in mlir_text:
        return []  # no reference to parse: a model with weights inline is hundreds of MB of tokens
    toks = list(_tokens(mlir_text))
    found: dict[str, None] = {}
    i = 0
    while i < len(toks):
        if toks[i] != ("ident", "#hal.executable.object") or toks[i + 1 : i + 3] != [("punct", "<"), ("punct", "{")]:
            i += 1
            continue
        # Read the dictionary's top-level keys: `key = value` or a unit `key`.
        depth, j = 1, i + 3
        keys: dict[str, object] = {}
        expect_key = True
        while j < len(toks) and depth > 0:
            kind, value = toks[j]
            if kind == "punct" and value in _OPEN:
                depth += 1
            elif kind == "punct" and value in _CLOSE:
                depth -= 1
            elif depth == 1 and kind == "punct" and value == ",":
                expect_key = True
            elif depth == 1 and expect_key and kind in ("ident", "string"):
                keys[value] = None
                expect_key = False
                if toks[j + 1 : j + 2] == [("punct", "=")] and j + 2 < len(toks) and toks[j + 2][0] == "string":
                    keys[value] = toks[j + 2][1]
            j += 1
        path = keys.get("path")
        if isinstance(path, str) and "data" not in keys:
            found.setdefault(path, None)
        i = j
    return list(found)


def resolve_object(path: str, search_paths: Sequence[PathLike], cwd: PathLike | None = None) -> tuple[Path | None, list[Path]]:
    """Where iree-compile finds an object: absolute as is, else the working directory, then
    each search path in order. Returns the file (or None) and every place tried."""
    p = Path(path)
    base = Path(cwd) if cwd is not None else Path.cwd()
    tried = [p] if p.is_absolute() else [base / p, *(Path(s).resolve() / p for s in search_paths)]
    for candidate in tried:
        if candidate.is_file():
            return candidate.resolve(), tried
    return None, tried


def is_mlir_bytecode(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == MLIR_BYTECODE_MAGIC
    except OSError:
        return False


@record
class Inputs:
    """What an action reads besides its primary source, and how names resolved."""

    files: list[Path] = field(default_factory=list)  # read by the tool: keyed by content, listed in the depfile
    resolution: list[str] = field(default_factory=list)  # how each name resolved: part of the key
    uncacheable: str | None = None  # why the inputs cannot be known (then nothing is cached)
    directories: list[Path] = field(default_factory=list)  # where headers were looked for (for a depfile)
    looked_in: set[str] = field(default_factory=set)  # candidate directories already noted

    def add(self, path: Path) -> None:
        if path not in self.files:
            self.files.append(path)

    def refuse(self, why: str) -> None:
        if self.uncacheable is None:
            self.uncacheable = why


# Flags whose value is where the compiler looks for objects named in the program.
_SEARCH_PATH_FLAGS = ("--iree-hal-executable-object-search-path",)
# Flag names that say the value is something the compiler writes: a cache hit would not
# write it, so such a compile is never cached.
_OUTPUT_FLAG = re.compile(r"(-to$|dump|output-file|print-ir)")


def _flag_values(argv: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """(flag name, candidate values) for `--flag=VALUE` and `--flag VALUE`. The candidates
    are the value, what follows each `=` in it (NAME=FILE) and its comma-separated parts."""
    name = ""
    for arg in argv:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq:
                yield name, []
                continue
        else:
            value = arg
        parts = [value]
        rest = value
        while "=" in rest:
            rest = rest.split("=", 1)[1]
            parts.append(rest)
        for part in list(parts):
            if "," in part:
                parts.extend(p for p in part.split(",") if p)
        yield name, [p for p in dict.fromkeys(parts) if p]


def compile_inputs(source: Path, argv: Sequence[str], *, cwd: PathLike | None = None) -> Inputs:
    """Every file iree-compile reads for `source` with flags `argv`, besides itself and its
    own installation: files named by flags, objects the MLIR (source and any MLIR named by a
    flag, such as a transform spec) references, resolved through the search paths."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    found = Inputs()
    search: list[Path] = []
    for name, values in _flag_values(argv):
        if name and _OUTPUT_FLAG.search(name):
            found.refuse(f"{name} makes iree-compile write files that a stored result could not restore")
            continue
        existing = False
        for value in values:
            path = base / value
            try:
                is_file, is_dir = path.is_file(), path.is_dir()
            except OSError:  # a name too long to be a path, say
                continue
            existing = existing or is_file or is_dir
            if is_file:
                found.add(path.resolve())
            elif is_dir and name in _SEARCH_PATH_FLAGS:
                search.append(path.resolve())
            elif is_dir and name.endswith("-from"):  # substitute-*-from: reads the files named by executable
                children = sorted(c for c in path.iterdir() if c.is_file())
                for child in children:
                    found.add(child.resolve())
                found.resolution.append(f"dir:{path.resolve()}:{','.join(c.name for c in children)}")
            elif is_dir:
                found.refuse(f"{name} names the directory {value}; which files the compiler reads from it is unknown")
        if not existing and any("/" in v for v in values):
            found.refuse(f"{name} names {values[0]}, which does not exist (an output, or a missing input)")
    mlir_files = [source, *(f for f in found.files if f.suffix in (".mlir", ".mlirbc"))]
    for mlir in mlir_files:
        if is_mlir_bytecode(mlir):
            found.refuse(f"{mlir} is MLIR bytecode; the objects it references cannot be read from it")
            continue
        try:
            text = mlir.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # iree-compile reports it
        for ref in referenced_objects(text):
            obj, _ = resolve_object(ref, search, cwd=base)
            found.resolution.append(f"object:{ref}->{obj or 'missing'}")
            if obj is not None:
                found.add(obj)
    found.resolution.extend(f"search:{s}" for s in search)
    return found


# One scanner of `#include` lines for every C-family compiler (C, CUDA, HIP, GLSL), read as
# the preprocessor reads them: lines spliced at backslash-newlines (trailing blanks allowed,
# as clang allows them), comments as one space, `%:` (digraph) and `??=` (trigraph) as `#`,
# `#import` as an include. The text is scanned as read with and without its comments removed,
# and the names of both scans are taken: an extra dependency costs a rebuild, a missed one a
# wrong output (a comment-removal slip, `<a//b.h>`, cannot hide a name).
_SPLICE = re.compile(r"\\[ \t\v\f]*\r?\n")
_COMMENT_OR_LITERAL = re.compile(
    r"(?:#|%:)[ \t]*(?:include_next|include|import|embed)[ \t]*<[^>\n]*>"  # a header name: `<a//b.h>` holds no comment
    r'|(?P<raw>\bR"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")'
    r'|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\''
    r"|(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))",
    re.DOTALL,
)
_DIRECTIVE = r"^[ \t\v\f]*(?:#|%:)[ \t\v\f]*"
_INCLUDE = re.compile(
    _DIRECTIVE + r'(?:include(?P<next>_next)?|import|(?P<embed>embed))\b[ \t\v\f]*(?:"(?P<quoted>[^"\n]+)"|<(?P<angled>[^>\n]+)>|(?P<other>\S.*))',
    re.MULTILINE,
)
# `#if __has_include("x.h")`, `__has_embed("x.bin")`: a file whose mere existence changes the code.
_HAS_INCLUDE = re.compile(
    r'__has_(?:include|(?P<embed>embed))(?P<next>_next)?\s*\(\s*(?:"(?P<quoted>[^"\n]+)"|<(?P<angled>[^>\n]+)>|(?P<other>[^)\s][^)\n]*))\s*\)'
)


def _without_comments(text: str) -> str:
    """`text` with each comment replaced by a space; string, character and raw string
    literals kept as they are (a `/*` in a string starts no comment)."""
    return _COMMENT_OR_LITERAL.sub(lambda m: " " if m["comment"] else m.group(0), text)


@record(frozen=True)
class IncludeDirective:
    """One `#include`-like name in a source: `kind` is include, has_include, embed (C23's
    `#embed`, whose file the compiler reads as bytes) or has_embed."""

    kind: str
    following: bool  # #include_next / __has_include_next
    name: str | None  # None: named through a macro (`other` holds the text)
    quoted: bool
    other: str = ""


def include_directives(text: str) -> list[IncludeDirective]:
    """Every header name `text` may include or test for, each once, in order found."""
    spliced = _SPLICE.sub("", text.replace("??=", "#").replace("??/", "\\"))
    stripped = _without_comments(spliced)
    found: dict[IncludeDirective, None] = {}
    for scanned, trusted in ((stripped, True), (spliced, False)):
        for test, pattern in (("has_", _HAS_INCLUDE), ("", _INCLUDE)):
            for m in pattern.finditer(scanned):
                kind = test + ("embed" if m["embed"] else "include")
                if m["other"] is not None:
                    # Only the comment-free text says a name is a macro: `#include /* c */ "h"` is not.
                    if trusted:
                        found.setdefault(IncludeDirective(kind, bool(m["next"]), None, False, m.group(0).strip()), None)
                    continue
                quoted = m["quoted"] is not None
                found.setdefault(IncludeDirective(kind, bool(m["next"]), m["quoted"] or m["angled"], quoted), None)
    return list(found)


def _candidates(quoted: bool, following: bool, current: Path, include_dirs: Sequence[Path]) -> list[Path]:
    """The directories the preprocessor tries, in order: quoted, the including file's first;
    `_next`, only those after the one the including file was found in."""
    bases = ([current.parent] if quoted and not following else []) + list(include_dirs)
    if following:
        holder = current.resolve().parent
        after = [i for i, d in enumerate(include_dirs) if Path(d).resolve() == holder]
        bases = list(include_dirs)[after[0] + 1 :] if after else list(include_dirs)
    return bases


def _watch(candidate: str, found: Inputs) -> None:
    """Note the nearest existing directory of a candidate: creating the header (or the
    subdirectory it would sit in) changes that directory's time, which a depfile can name."""
    directory = os.path.dirname(candidate)
    if directory in found.looked_in:
        return
    found.looked_in.add(directory)
    while not os.path.isdir(directory) and directory != os.path.dirname(directory):
        directory = os.path.dirname(directory)
    if Path(directory) not in found.directories:
        found.directories.append(Path(directory))


def _look_up(name: str, quoted: bool, current: Path, include_dirs: Sequence[Path], found: Inputs, *, following: bool = False) -> Path | None:
    """Where the preprocessor finds `name` from `current` (quoted: its directory first, then
    each -I; angled: each -I; `_next`: the -I after the including file's), noting each place
    it looks: a header that appears in one of them later changes the answer."""
    for base in _candidates(quoted, following, current, include_dirs):
        candidate = os.path.join(base, name)
        _watch(candidate, found)
        if os.path.isfile(candidate):  # resolved only when found: most lookups miss
            return Path(candidate).resolve()
    return None


def c_includes(source: Path, include_dirs: Sequence[Path]) -> Inputs:
    """The headers a C/CUDA/GLSL source includes, found by following `#include` lines (and the
    files it `#embed`s), and how each name (and each `__has_include` and `__has_embed` name)
    resolved, found or not. The resolution goes into
    the cache key, so a header that appears earlier on the search path, or a `__has_include`
    target that starts to exist, is a miss; a depfile lists only what was found. Every line is
    followed, even in comments or disabled branches: an extra dependency costs a rebuild, a
    missed one a wrong output. An include through a macro cannot be followed: not cacheable
    for compilers that write no dependency list (NVRTC), the callers decide."""
    found = Inputs()
    pending = [source]
    seen: set[Path] = {source.resolve()}
    while pending:
        current = pending.pop()
        try:
            text = current.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for d in include_directives(text):
            if d.name is None:
                found.refuse(f"{current}: `{d.other}` names its header through a macro")
                continue
            hit = _look_up(d.name, d.quoted, current, include_dirs, found, following=d.following)
            # An #include not found on the search path is the compiler's own header (stdint.h), part of the tool.
            found.resolution.append(f"{d.kind}:{current}:{d.name}->{hit or ('tool' if d.kind == 'include' else 'none')}")
            if d.kind == "embed" and hit is not None:  # read as bytes: no directive in it is followed
                found.add(hit)
            if d.kind == "include" and hit is not None and hit not in seen:
                seen.add(hit)
                found.add(hit)
                pending.append(hit)
    return found


def header_lookups(sources: Sequence[Path], include_dirs: Sequence[Path]) -> Inputs:
    """c_includes of every source, merged: for a compiler that writes a depfile, the part a
    depfile cannot say (which names resolved where, and which did not)."""
    merged = Inputs()
    for source in sources:
        one = c_includes(source, include_dirs)
        merged.resolution += one.resolution
        if one.uncacheable:
            merged.refuse(one.uncacheable)
        for path in one.files:
            merged.add(path)
        merged.directories += [d for d in one.directories if d not in merged.directories]
    return merged


def watched_directories(directories: Sequence[Path], outputs: Sequence[Path]) -> list[Path]:
    """The directories headers were looked for in, for a depfile: Ninja reruns a step when a
    directory's time changes (a file created or removed in it), which a list of found files
    cannot catch. A directory holding one of the step's own outputs is left out: writing the
    output changes its time, and the step would never be up to date."""
    holding = {d for o in outputs for d in (o.resolve().parent, o.resolve().parent.parent)}
    return [d for d in directories if d.resolve() not in holding and d.is_dir()]


# What the assembler reads that no compiler's dependency output lists (clang's -MD leaves out
# `.incbin` and `.include`, in inline asm and in .S files alike): a directive that reads a file,
# a macro facility that can paste a directive's name together (`.macro`, `.irp`, `.irpc` and
# `.altmacro` substitute parameters and `\()` into names), or a directive name that an inline
# asm operand completes (`".inc%c0"`). The words are matched as the assembler reads directive
# names (in any case) anywhere in the preprocessed text, so a macro cannot hide one; a word of
# C code that matches costs the cache, never a wrong output.
_ASM_READS = re.compile(r"\b(incbin|include|macro|irpc?|altmacro)\b", re.IGNORECASE)
# An asm statement's template (one literal once adjacent ones are joined), and a directive
# name in it that an operand completes (`.%c0`, `.inc%c0`; `"%s.%s"` of a printf is no template).
_ASM_TEMPLATE = re.compile(r'\b(?:__asm__|__asm|asm)\b[\s\w]*\(\s*(?:u8|[uUL])?"((?:[^"\\\n]|\\.)*)"')
_OPERAND_NAME = re.compile(r"(?:^|[\s;])\.[A-Za-z_]*%")
_ASM_PATH = re.compile(r'\.(?:incbin|include)[ \t]+"([^"\n]+)"', re.IGNORECASE)
_ADJACENT_LITERALS = re.compile(r'(?:(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"\s*){2,}')
_LITERAL_BODY = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_C_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]+|[0-7]{1,3}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f", "a": "\a", "b": "\b"}


def _unescaped_c(match: re.Match[str]) -> str:
    code = match[1]
    if code[0] in "xuU" and len(code) > 1:
        return chr(min(int(code[1:], 16), 0x10FFFF))
    if code[0].isdigit():
        return chr(int(code, 8))
    return _SIMPLE_ESCAPES.get(code, code)


def assembler_reads(preprocessed: str) -> tuple[str | None, list[str]]:
    """Why the assembler may read files that the compiler's dependency output does not list,
    for a source's preprocessed text (or an assembly file's own), or None; and the paths its
    `.incbin` and `.include` lines name as written (for a depfile: Ninja then reruns the step
    when one changes). The text is read as the assembler gets it: adjacent string literals
    joined and their escapes (`\\x62`, `\\142`) decoded."""
    joined = _ADJACENT_LITERALS.sub(lambda m: '"' + "".join(_LITERAL_BODY.findall(m[0])) + '" ', preprocessed)
    text = _C_ESCAPE.sub(_unescaped_c, joined)
    found = _ASM_READS.search(text)
    completed = [m[0].strip() for t in _ASM_TEMPLATE.findall(joined) for m in [_OPERAND_NAME.search(_C_ESCAPE.sub(_unescaped_c, t))] if m]
    if found is None and not completed:
        return None, []
    paths = list(dict.fromkeys(_ASM_PATH.findall(text)))
    held = f"`.{found[1].lower()}`" if found else f"a directive name an asm operand completes (`{completed[0]}`)"
    return f"its assembly holds {held}: the files the assembler reads through `.incbin` and `.include` are not in the compiler's dependency output", paths

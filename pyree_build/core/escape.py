"""One escaping rule per output language, for text pyree_build does not control: names and
strings from a model (ONNX node, input, output and graph names, attributes) and paths.

A model downloaded from a hub is untrusted input: a node name holding a newline would end
a `//` comment of the generated C and write code after it, a U+202E would reorder what a
terminal shows. Every generator writes such text through the rule of the language it
writes, so nothing a model holds is ever live. JSON needs no rule here: json.dumps'
default (ensure_ascii) escapes every control and non-ASCII character.

Imports nothing of the package (errors.py uses it).
"""

from __future__ import annotations

import re
import unicodedata

# Shown as their usual escapes; any other character a rule escapes as \xNN, \uNNNN or \UNNNNNNNN.
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
# Unicode categories that are not a visible character of their own: controls, format
# characters (the bidi overrides and isolates, zero-width joiners), line and paragraph
# separators, surrogates, private use and unassigned code points.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


# Text every rule leaves as it is (printable ASCII, no backslash): checked once per string, so
# a model's thousands of names cost one regex each, not a Python step per character.
_PLAIN = re.compile(r"[ -\[\]-~]*")
_PLAIN_LINES = re.compile(r"[ -\[\]-~\n\t\\]*")
_COMMENT_BREAKS = ("??", "/*", "*/")


def _code(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def comment(text: str) -> str:
    """`text` as the body of one `//` comment line of C, C++, CUDA, HIP, GLSL or MLIR: printable
    ASCII only, everything else escaped. So no newline ends the comment early, no backslash
    ends a line (a line splice) nor does `??/` (its trigraph), `/*` and `*/` are broken up, and
    no compiler sees a character its language's set lacks (GLSL's is ASCII)."""
    if _PLAIN.fullmatch(text) and not any(b in text for b in _COMMENT_BREAKS):
        return text
    out: list[str] = []
    for ch in text:
        previous = out[-1][-1:] if out else ""
        if ch == "\\":
            out.append("\\x5c")  # never `\\`: a comment ending in `\` splices the next line into it
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif not " " <= ch <= "~" or (ch == "?" and previous == "?") or (ch == "/" and previous == "*") or (ch == "*" and previous == "/"):
            out.append(_code(ch))
        else:
            out.append(ch)
    return "".join(out)


def c_comment(text: str) -> str:
    """One `//` comment line holding `text` (comment's rule); `//` alone for empty text."""
    return f"// {comment(text)}" if text else "//"


def name(text: str) -> str:
    """One name as printed on a terminal, inside a line: every character that is not a visible
    one of its own (newlines and tabs too, controls, bidi overrides, zero-width characters) and
    the backslash escaped, so a name can neither break the line, move the cursor, reorder what
    is shown, nor pass for an escape it is not."""
    if _PLAIN.fullmatch(text):
        return text
    return "".join(_NAMED.get(ch) or (_code(ch) if unicodedata.category(ch) in _INVISIBLE else ch) for ch in text)


def terminal(text: str) -> str:
    """Text of several lines as printed on a terminal: name's rule on each line, the line breaks
    and tabs kept as layout. The backslash is kept as well: this is prose (a compiler's output,
    a path), not a name a reader must read back exactly."""
    if _PLAIN_LINES.fullmatch(text):
        return text
    return "".join(ch if ch in "\n\t\\" else name(ch) for ch in text)


def mlir_string(text: str) -> str:
    """`text` as the body of an MLIR string literal ("..."): each byte of a quote, a backslash
    or a character that is not printable as \\XX, which MLIR's lexer reads back as that byte."""
    return "".join(c if c.isprintable() and c not in '"\\' else "".join(f"\\{b:02X}" for b in c.encode("utf-8", "surrogatepass")) for c in text)


def cmake_quoted(text: str) -> str:
    """`text` as the body of a CMake quoted argument ("..."), read back as exactly `text`: no
    variable reference (`${`, `$ENV{`), quote or backslash is live. A `;` stays as it is: in a
    quoted argument it is part of the one value (`\\;` would be kept as two characters)."""
    out: list[str] = []
    for ch in text:
        if ch in '\\"$':
            out.append("\\" + ch)
        elif ch in "\n\t\r":
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in _INVISIBLE:
            # CMake has no escape for these (nor for NUL): refuse rather than write a control character.
            raise ValueError(f"{name(ch)} has no form in a CMake argument")
        else:
            out.append(ch)
    return "".join(out)

"""Escaping's shortcut for plain text (one regex per string) against the rules it stands for,
written here character by character: for every string, the same output."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from pyree_build.core import escape

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def _code(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def comment_by_character(text: str) -> str:
    out: list[str] = []
    for ch in text:
        previous = out[-1][-1:] if out else ""
        if ch == "\\":
            out.append("\\x5c")
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif not " " <= ch <= "~" or (ch == "?" and previous == "?") or (ch == "/" and previous == "*") or (ch == "*" and previous == "/"):
            out.append(_code(ch))
        else:
            out.append(ch)
    return "".join(out)


def name_by_character(text: str) -> str:
    return "".join(_NAMED.get(ch) or (_code(ch) if unicodedata.category(ch) in _INVISIBLE else ch) for ch in text)


def terminal_by_character(text: str) -> str:
    return "".join(ch if ch in "\n\t\\" else name_by_character(ch) for ch in text)


# Mostly plain ASCII (the shortcut's case), with the characters each rule treats specially.
_TEXT = st.text(
    alphabet=st.one_of(st.characters(min_codepoint=32, max_codepoint=126), st.sampled_from("\n\t\r\\?/*\x00\x7f\u202e\u200bé\U0001f600")), max_size=24
)


@settings(max_examples=3000, deadline=None)
@given(_TEXT)
def test_each_rule_gives_what_its_character_rule_gives(text):
    assert escape.comment(text) == comment_by_character(text)
    assert escape.name(text) == name_by_character(text)
    assert escape.terminal(text) == terminal_by_character(text)

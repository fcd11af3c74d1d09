"""Shared by the tests: normal_output, TIMES (once in test_server.py)."""

from __future__ import annotations

import re
from pathlib import Path

TIMES = re.compile(r"\d+(\.\d+)? ?(s|ms|us)\b")


def normal_output(text: str, root: Path) -> str:
    return TIMES.sub("<time>", text.replace(str(root), "<dir>"))

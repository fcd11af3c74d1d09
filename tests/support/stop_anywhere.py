"""Stop a command at each of its file-system steps in turn (run as a script: an audit hook
cannot be removed, so it lives in a process of its own).

`python stop_anywhere.py COMMAND SOURCE ROOT CACHE STRIDE` runs COMMAND into ROOT/at<N>, once
for each N = STRIDE, 2 STRIDE...: `ptx` builds SOURCE's PTX for two sm with a depfile (a scratch
directory, a set of outputs), `new` writes a project (a staged set of files moved into a
directory with its manifest; SOURCE unused). In each run the Nth file-system audit
event of that build (an open, a mkdir, a rename, an unlink, an rmtree...) raises SIGTERM, as
`kill` would at that moment, under `pb.stop_on_signals()`. CACHE is `off`, `hit` (one cache,
filled by a first build) or `miss` (a new cache per build). It prints one JSON line per build:
where the stop came, whether the command raised the stop, and every file left in its output
directory and its cache. It ends after the first build that the stop never reached.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pyree_build as pb

SMS = [75, 80]


def main() -> None:
    command, source, root, cache, stride = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    state: dict[str, object] = {"armed": False, "count": 0, "at": 0, "event": None}

    def on_event(event: str, args: tuple[object, ...]) -> None:
        if state["armed"] and (event.startswith(("os.", "shutil.")) or event == "open"):
            state["count"] = count = int(state["count"]) + 1  # type: ignore[call-overload]
            if count == state["at"]:
                state["event"] = f"{event} {args[0] if args else ''}"
                signal.raise_signal(signal.SIGTERM)

    sys.addaudithook(on_event)
    os.environ["PYREE_BUILD_CACHE"] = "off" if cache == "off" else str(root / "cache")

    def build(out: Path, at: int) -> dict[str, object]:
        if cache == "miss":
            os.environ["PYREE_BUILD_CACHE"] = str(out) + ".cache"
        state.update(armed=True, count=0, at=at, event=None)
        try:
            with pb.stop_on_signals():
                if command == "ptx":
                    pb.ptx(source, SMS, out, depfile=out / "ptx.d")
                else:
                    pb.new(out, name="demo")
            outcome = "finished"
        except KeyboardInterrupt as stop:
            outcome = f"stopped {getattr(stop, 'exit_code', '?')}"
        finally:
            state["armed"] = False
        left = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} if out.exists() else {}
        dirs = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_dir()) if out.exists() else []
        store = Path(os.environ["PYREE_BUILD_CACHE"])
        in_cache = sorted(p.name for p in store.rglob("*")) if store.is_dir() else []
        return {
            "at": at, "outcome": outcome, "event": state["event"], "events": state["count"],
            "files": {name: data.decode("utf-8", "replace") for name, data in sorted(left.items())},
            "dirs": dirs, "cache": in_cache,
        }  # fmt: skip

    print(json.dumps(build(root / "reference", 0)), flush=True)
    at = stride
    while True:
        row = build(root / f"at{at}", at)
        print(json.dumps(row), flush=True)
        if row["event"] is None:
            return
        at += stride


if __name__ == "__main__":
    main()

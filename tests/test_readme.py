"""The READMEs are executable truth: every ```sh / ```bash / ```python block of README.md, of each
sample's README and of the README `pyree-build new` writes runs, in order, in a scratch copy
of the checkout, and must exit 0 and print what it claims.

Conventions inside a block (visible in the README on purpose):
  `# readme-test: skip (REASON)`  the block is reported as skipped with REASON;
  `# readme-test: needs WHAT`     skipped unless WHAT is available here (see NEEDS);
  `# => TEXT`                     the block's output must contain TEXT (`...` matches anything).
Blocks of other languages (cmake, tables) are fragments, not commands, and are not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

RUNNABLE = {"sh": "bash", "bash": "bash", "shell": "bash", "python": "python"}
MARKER = re.compile(r"^\s*#\s*readme-test:\s*(skip|needs)\s*(.*?)\s*$")
CLAIM = re.compile(r"^\s*#\s*=>\s?(.*)$")


@dataclass
class Block:
    readme: Path  # relative to the checkout
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.readme}:{self.line}"

    def markers(self) -> list[tuple[str, str]]:
        return [(m.group(1), m.group(2)) for m in map(MARKER.match, self.code.splitlines()) if m]

    def claims(self) -> list[str]:
        return [m.group(1).strip() for m in map(CLAIM.match, self.code.splitlines()) if m]


def extract(text: str, readme: Path) -> list[Block]:
    blocks, inside, start, lang, lines = [], False, 0, "", []
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```\s*([\w+-]*)", line)
        if fence and not inside:
            inside, start, lang, lines = True, number, fence.group(1).lower(), []
        elif line.startswith("```") and inside:
            inside = False
            if lang in RUNNABLE:
                blocks.append(Block(readme, start, RUNNABLE[lang], "\n".join(lines) + "\n"))
        elif inside:
            lines.append(line)
    return blocks


def _have_tool(finder: Callable[[], object]) -> Callable[[], bool]:
    def check() -> bool:
        from pyree_build.core.errors import PyreeError

        try:
            finder()
            return True
        except PyreeError:
            return False

    return check


def _installed_wheel() -> bool:
    from pyree_build.cli import cmake_dir

    return "site-packages" in str(cmake_dir())


def _cuda_gpu() -> bool:
    from pyree_build.backends.cuda.target import cuda_status

    return cuda_status()[0]


def _vulkan_device() -> bool:
    from pyree_build.backends.vulkan.devices import status

    return status()[0]


def _importable(*modules: str) -> Callable[[], bool]:
    import importlib.util

    return lambda: all(importlib.util.find_spec(m) is not None for m in modules)


def _needs() -> dict[str, Callable[[], bool]]:
    from pyree_build.core import toolchain

    return {
        "nvcc": _have_tool(toolchain.nvcc),
        "ptxas": _have_tool(toolchain.ptxas),
        "nvrtc": _have_tool(toolchain.nvrtc),
        "glslang": _have_tool(lambda: (toolchain.glsl_compiler(), toolchain.spirv_val())),
        "a CUDA GPU": _cuda_gpu,
        "a Vulkan device": _vulkan_device,
        "pyree_build installed from a wheel": _installed_wheel,
        "onnx": _importable("onnx", "onnxruntime"),
        "torch": _importable("torch", "onnx", "onnxruntime"),
    }


def skip_reason(block: Block) -> str | None:
    needs = _needs()
    for kind, what in block.markers():
        if kind == "skip":
            return what.strip("() ") or "marked skip"
        label = what.split("(")[0].strip()
        if label not in needs:
            raise AssertionError(f"{block.id}: unknown `readme-test: needs {what}`; known: {', '.join(needs)}")
        if not needs[label]():
            return f"needs {what}"
    return None


def check_claims(block: Block, output: str) -> None:
    for claim in block.claims():
        pattern = ".*?".join(re.escape(part.strip()) for part in claim.split("..."))
        assert re.search(pattern, output, re.S), f"{block.id}: the README claims output {claim!r}; got:\n{output[-3000:]}"


def _environment(scratch: Path) -> dict[str, str]:
    """`pyree-build`, `python` and `pip` as a user of this checkout has them; a private cache."""
    bin_dir = scratch / ".readme-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("pyree-build", f'"{sys.executable}" -m pyree_build'), ("python", f'"{sys.executable}"'),
                          ("python3", f'"{sys.executable}"'), ("pip", f'"{sys.executable}" -m pip')):  # fmt: skip
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if not _installed_wheel():
        # A checkout on PYTHONPATH: CMake's search for "the Python with pyree_build" could
        # settle on another interpreter that sees it too, so name this one (as documented).
        env["PYTHONPATH"] = str(scratch) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYREE_BUILD_PYTHON"] = sys.executable
    env["PYREE_BUILD_CACHE"] = str(scratch / ".readme-cache")
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    reason = skip_reason(block)
    if reason:
        pytest.skip(f"{block.id}: {reason}")
    if block.language == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        argv = [sys.executable, "-c", block.code]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.id} failed (exit {proc.returncode}):\n{block.code}\n--- output ---\n{output[-4000:]}"
    check_claims(block, output)


def _readmes() -> list[Path]:
    walkthroughs = [Path("docs") / name for name in WALKTHROUGHS]
    return [Path("README.md"), *walkthroughs, *sorted(p.relative_to(REPO) for p in (REPO / "samples").rglob("README.md"))]


# Pages of docs/ that are walk-throughs: every block runs, as in a README.
WALKTHROUGHS = ("your-kernel-in-an-onnx-model.md", "cache-and-rebuilds.md")


BLOCKS = [b for readme in _readmes() for b in extract((REPO / readme).read_text(encoding="utf-8"), readme)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout, as a user who cloned it has it; blocks run in it in order."""
    root = tmp_path_factory.mktemp("readme") / "pyree_build"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", "build", "__pycache__", "*.egg-info", ".pytest_cache"))
    return root, _environment(root)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(block: Block, scratch: tuple[Path, dict[str, str]]) -> None:
    root, env = scratch
    run_block(block, root / block.readme.parent, env)


def _new_readme_blocks() -> list[Block]:
    from pyree_build.actions.scaffold import sample_readme

    return extract(sample_readme("fresh_project"), Path("fresh_project/README.md"))


NEW_BLOCKS = _new_readme_blocks()


@pytest.fixture(scope="module")
def new_project(scratch: tuple[Path, dict[str, str]]) -> Path:
    root, env = scratch
    project = root.parent / "fresh_project"
    subprocess.run([sys.executable, "-m", "pyree_build", "new", project], env=env, check=True, capture_output=True)
    return project


@pytest.mark.slow
@pytest.mark.parametrize("block", NEW_BLOCKS, ids=[b.id for b in NEW_BLOCKS])
def test_new_project_readme_block(block: Block, new_project: Path, scratch: tuple[Path, dict[str, str]]) -> None:
    assert extract((new_project / "README.md").read_text(encoding="utf-8"), block.readme)[NEW_BLOCKS.index(block)].code == block.code
    run_block(block, new_project, scratch[1])


def test_the_conventions_are_checked():
    """A claim that the output lacks fails; markers parse; other languages are not run."""
    text = "```sh\necho hello\n# => hel...lo\n```\n```cmake\nnot run\n```\n```python\n# readme-test: skip (why)\n```\n"
    sh, py = extract(text, Path("X.md"))
    assert (sh.language, sh.claims(), py.markers()) == ("bash", ["hel...lo"], [("skip", "(why)")])
    check_claims(sh, "hello")
    with pytest.raises(AssertionError, match="claims output"):
        check_claims(sh, "goodbye")
    assert skip_reason(py) == "why"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _markdown_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "samples").rglob("README.md"))]


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_a_page_leads_somewhere(page: Path) -> None:
    """Sections moved between the README and docs/ keep their links: each relative link names a
    file that exists, and each #anchor a heading of the page it points into."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(REPO)}: link to {target}: {path} does not exist"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", linked.read_text(encoding="utf-8"), flags=re.S), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.relative_to(REPO)}: link to {target}: no such heading"

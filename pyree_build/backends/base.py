"""What a backend declares: the small interface every target implements.

A backend is one IREE target (`--target` of compile) with everything pyree_build knows about
it: the iree-compile flags that select it, its options, the checks before and after
iree-compile, the explanations of its errors, the run devices it serves and how to tell
whether one is usable, the verbs that build its kernels, and its rows in `doctor`.
`compile`, `run`, `doctor` and the CLI ask the registry (backends/__init__.py) for these;
none of them names a target.

This module is imported by every command, so it imports nothing heavy.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build.core import readers
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import field, record
from pyree_build.core.toolchain import Tool

Probe = Callable[[], "tuple[bool, str]"]


@record(frozen=True)
class Option:
    """A command-line option a backend owns (`--sm` of cuda), added to the verbs it names.

    `dest` is also the keyword of the Python function the verb calls; `kwargs` are argparse's
    (help, default, metavar, choices, action, ...).
    """

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        explicit = self.kwargs.get("dest")
        if explicit:
            return str(explicit)
        longest = max(self.flags, key=len)
        return longest.lstrip("-").replace("-", "_")


@record(frozen=True)
class Verb:
    """A CLI verb (and Python function) that builds a backend's kernels, e.g. `ptx`.

    `function` is "module:attribute", imported only when the verb runs. Its keyword names
    are the options' dests; what it returns is shown as the CLI shows every build: each path
    as `wrote PATH`, a string printed as it is. `actions` are sub-verbs (`fatelf join`).
    A function that takes `jobs` gets the common option -j.
    """

    name: str
    help: str
    function: str = ""
    options: tuple[Option, ...] = ()
    actions: tuple[Verb, ...] = ()
    #: the paragraph `--help` shows above the options (at least a sentence), and its examples,
    #: one command line per line, each starting `pyree-build`.
    description: str = ""
    examples: str = ""

    def load(self) -> Callable[..., Any]:
        module, _, attr = self.function.partition(":")
        function: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return function


@record(frozen=True)
class ToolCheck:
    """A tool `doctor` looks for: its label, how to find it, what it is for, how to install it."""

    label: str
    find: Callable[[], Tool]
    required: bool
    purpose: str
    install: str


@record(frozen=True)
class Workflow:
    """One row of doctor's workflow table. `build` and `run` name ToolCheck labels ("a|b":
    either will do); `device` is the device whose probe says whether it runs here ("host": the CPU)."""

    name: str
    build: tuple[str, ...]
    run: tuple[str, ...]
    device: str = "host"


@record
class CompileJob:
    """What one compile knows, handed to its backend's hooks.

    `options` holds every target option the caller gave (`sm`, `gfx`, `vulkan_target`, `cpu`,
    and any a registered backend declares); a backend reads its own.
    """

    source: Path
    text: str
    output: Path
    options: Mapping[str, Any]
    search_paths: list[Path]
    link_bitcode: list[Path]
    #: transform / PDL specs and preprocessing pipeline files, read with the program.
    spec_files: list[Path] = field(default_factory=list)


@record
class InlineKernelSource:
    """A kernel source given to `pb.load_inline`, written to `source` in `build_dir`, with the
    program text (the names of the objects it references) and the caller's build options:
    `kind` (a plugin's kind), `include_dirs`, `defines`, and the target options of compile."""

    source: Path
    program: str
    build_dir: Path
    kind: str
    include_dirs: list[Path]
    defines: list[str]
    options: Mapping[str, Any]


class Backend:
    """The interface; subclasses override what their target needs.

    Class attributes are data (read without running anything); methods are hooks that
    compile, run and doctor call. A backend module ends with `BACKEND = TheBackend()`, and
    one line in backends/__init__.py (or an entry point in the `pyree_build.backends` group)
    registers it.
    """

    #: the `--target` name (IREE's target device / backend name).
    name: str = ""
    #: one line for help and doctor.
    description: str = ""
    #: `--device` values whose modules this backend compiles (their driver names).
    devices: tuple[str, ...] = ()
    #: compile options this target reads (added to `compile`, and `dump` where listed there).
    compile_options: tuple[Option, ...] = ()
    #: the verbs that build this target's kernels.
    verbs: tuple[Verb, ...] = ()
    #: tools doctor lists, and its workflow rows.
    tools: tuple[ToolCheck, ...] = ()
    workflows: tuple[Workflow, ...] = ()
    #: whether `pb.run` may read results through IREE's Python runtime on this target's devices.
    runs_in_process: bool = True
    #: whether each process may build the device's pipelines again, at a cost like a call's (a
    #: driver compiling every shader: lavapipe's LLVM on a shader's first dispatch). Several
    #: calls of one module (verify's draws) then run in one process (run.run_calls).
    pipelines_per_process: bool = False
    #: whether `dump` supports this target.
    dumps: bool = False
    #: whether an executable's object (not only its source) may be substituted on this target.
    substitutes_objects: bool = True

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        """The iree-compile flags that select this target."""
        raise NotImplementedError

    def search_paths(self, job: CompileJob) -> list[Path]:
        """Where iree-compile looks for objects (a target may put its own directories first)."""
        return job.search_paths

    def before_compile(self, job: CompileJob) -> None:
        """Checks that need the program and its objects, before iree-compile runs."""

    def wants_binaries(self, job: CompileJob) -> bool:
        """Whether after_compile needs the executables' binaries (dumped into a scratch directory)."""
        return False

    def after_compile(self, job: CompileJob, binaries: Path | None) -> None:
        """Checks of what iree-compile produced; raise PyreeError to refuse the module."""

    def explain(self, job: CompileJob, compiler_output: str) -> str | None:
        """A better message for an iree-compile failure on this target, or None."""
        return None

    def require_imports(self, module: Path, names: Sequence[str]) -> None:
        """`compile --expect-import NAME`: raise PyreeError unless the module runs NAME. Here (GPU
        targets): the module holds the precompiled executable NAME_executable that a
        `replace --target` spec dispatches in place of its group. IREE keeps an executable only
        where a dispatch uses it, and names it in the module (NAME_executable_<format>.fb, and
        in the message for a device without its format); two executables whose objects are the
        same bytes are folded into one, whose data keeps one name, while both names stay in the
        messages (checked on 3.13 for vulkan-spirv-fb, cuda-nvptx-fb and rocm-hsaco-fb). CPU
        targets read the imports instead."""
        data = readers.read_module(module)
        held = sorted({m.decode() for m in re.findall(rb"([A-Za-z_][\w$.-]*)_executable(?:_[a-z0-9_]+\.fb|(?![\w$.-]))", data)})
        missing = [n for n in names if n not in held]
        if missing:
            raise PyreeError(
                f"the compiled module does not dispatch {', '.join(f'{m}_executable' for m in missing)} "
                f"(the kernel{'s' if len(missing) > 1 else ''} of {', '.join(repr(m) for m in missing)})",
                file=module,
                details="precompiled executables it holds: " + (", ".join(f"{h}_executable" for h in held) or "none"),
                fix="if a transform spec should have placed the dispatch, its matcher found nothing: compare it with the program "
                "(`pyree-build ops` lists the groups it can match)",
            )

    def missing_object_hint(self, name: str, search_paths: Sequence[Path]) -> str:
        """A line added under an object iree-compile could not find (e.g. the name it has under
        another spelling), or ""."""
        return ""

    def probe(self, device: str) -> tuple[bool, str]:
        """(usable, reason) for running on `device` here (one of `devices`, or a Workflow's
        `device`); run stops before an unusable one, doctor shows the reason."""
        return True, f"{device} needs no probe"

    def check_module(self, module: Path, device: str) -> None:
        """Before `module` runs on `device` (as the user named it, `vulkan://1`): raise
        PyreeError where it would fail or compute wrong results there, which the runtime
        would not say."""

    def unusable_fix(self, device: str) -> str:
        """What to do when probe() says the device is not usable."""
        return "run `pyree-build doctor` to see which devices are usable here"

    def explain_run(self, run_output: str) -> str | None:
        """A better message for a failed run of a module of this target, or None."""
        return None

    #: suffixes of the kernel sources `pb.load_inline` builds for this target (".cu").
    inline_suffixes: tuple[str, ...] = ()

    def build_inline_objects(self, kernel: InlineKernelSource) -> list[Path]:
        """Build a `pb.load_inline` kernel that the module embeds (before iree-compile runs);
        returns the directories iree-compile searches for its objects."""
        return []

    def build_inline_plugins(self, kernel: InlineKernelSource, module: Path) -> list[Path]:
        """Build a `pb.load_inline` kernel that the module loads at run time (after iree-compile
        ran, so the module's imports are known); returns the plugins to run it with."""
        return []

    def __repr__(self) -> str:
        return f"<pyree_build backend {self.name}>"

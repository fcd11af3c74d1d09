"""`pb.torch_op`: a kernel built by `pb.load_inline(args=...)` as a torch operator.

The operator is defined from the kernel's signature: `in` buffers are Tensor arguments,
scalars float or int, `out` buffers its results. It is an iree-turbine CustomOp: eagerly it
calls the kernel in this process (tensors read through DLPack, no copy); its meta (fake)
implementation makes empty results of the sizes the signature gives, so torch.export and
torch.compile trace through it without running it; and when iree-turbine exports a module
that calls it, the op becomes the signature's program (the dispatch that calls the kernel's
import, actions/signature.py), so the compiled module calls the kernel's plugin. A scalar is
then the value the traced call passed (a constant of the program). Without iree-turbine the
operator is defined with torch.library alone (eager and fake, no export to IREE).

Loading the same name again with a kernel of the same signature (an edit in a notebook) swaps
the kernel behind the operator; a different signature redefines it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from pyree_build.actions import signature as signature_module
from pyree_build.actions.inline import InlineKernel
from pyree_build.actions.signature import Param, Signature
from pyree_build.core import lazy
from pyree_build.core.errors import PyreeError
from pyree_build.models.ir import torch_import

torch = lazy.module("torch")
op_reg = lazy.module("iree.turbine.runtime.op_reg")

_NAME = re.compile(r"(?P<namespace>[A-Za-z_][A-Za-z0-9_]*)::(?P<op>[A-Za-z_][A-Za-z0-9_]*)")
_LOCK = threading.Lock()
# name -> (the schema it was defined with, its library (kept alive), the kernel it runs now)
_DEFINED: dict[str, tuple[str, Any, list[InlineKernel]]] = {}


def schema(sig: Signature, op: str) -> str:
    """torch's schema of the operator: `axpy(Tensor p1, Tensor p2, float p3) -> Tensor`."""
    params = []
    for p in sig.operands:
        if p.is_buffer:
            params.append(f"Tensor(a{p.position}!) p{p.position}" if p.kind == "inout" else f"Tensor p{p.position}")
        else:
            params.append(f"{'float' if p.type.startswith('f') else 'int'} p{p.position}")
    outs = [p for p in sig.params if p.kind == "out"]
    returns = "()" if not outs else "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    return f"{op}({', '.join(params)}) -> {returns}"


def _fake(sig: Signature) -> Callable[..., Any]:
    """Empty results of the signature's sizes, read from the (fake) inputs' shapes."""

    def fake(*args: Any) -> Any:
        sizes: dict[str, Any] = {}
        for p, value in zip(sig.operands, args):
            for d, extent in zip(p.dims or (), getattr(value, "shape", ())):
                if isinstance(d, str):
                    sizes.setdefault(d, extent)
        device = next((a.device for a in args if hasattr(a, "device")), "cpu")
        made = [
            torch.empty([d if isinstance(d, int) else sizes[d] for d in p.dims or ()], dtype=_dtype(p), device=device) for p in sig.params if p.kind == "out"
        ]
        return None if not made else made[0] if len(made) == 1 else tuple(made)

    return fake


def _dtype(p: Param) -> Any:
    return getattr(torch, str(p.dtype))


def torch_op(kernel: InlineKernel, name: str) -> Any:
    """Register `kernel` as the torch operator `name` ("mylib::axpy") and return it
    (`torch.ops.mylib.axpy`)."""
    try:
        torch.__version__  # noqa: B018 - the first read imports torch: say what to install if it is missing
    except ImportError as exc:
        raise PyreeError(f"pb.torch_op needs torch ({exc})", fix="pip install torch") from None
    sig = kernel.signature if isinstance(kernel, InlineKernel) else None
    if sig is None:
        raise PyreeError(
            "pb.torch_op takes a kernel built from a signature: pb.load_inline(c_source=..., function=..., args=...)",
            fix="load the kernel with args= (its signature tells torch the operator's arguments and result sizes)",
        )
    if any(p.kind == "inout" for p in sig.params):
        raise PyreeError(
            "pb.torch_op takes kernels without inout buffers: a torch operator returns its results",
            fix="make the buffer an in and an out (in:f32[n], out:f32[n]) and return the updated values",
        )
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise PyreeError(f"{name!r} is not an operator name NAMESPACE::NAME", fix='pass e.g. "mylib::axpy" (letters, digits and _)')
    text = schema(sig, match["op"])
    with _LOCK:
        known = _DEFINED.get(name)
        if known is not None and known[0] == text:
            known[2][0] = kernel  # an edit: same operator, new code
            return getattr(getattr(torch.ops, match["namespace"]), match["op"])
        if known is not None:
            known[1]._destroy()  # another signature: the old definition goes
        _DEFINED[name] = (text, _define(name, match["namespace"], text, sig), [kernel])
    return getattr(getattr(torch.ops, match["namespace"]), match["op"])


def _define(name: str, namespace: str, text: str, sig: Signature) -> Any:
    try:
        op_reg.CustomOp  # noqa: B018 - present: the op is one turbine can export
    except ImportError:
        return _define_plain(name, namespace, text, sig)
    torch_import.bridge_bindings()
    return _define_custom_op(name, namespace, text, sig)


def _define_plain(name: str, namespace: str, text: str, sig: Signature) -> Any:
    library = torch.library.Library(namespace, "FRAGMENT")
    library.define(text)

    def run(*args: Any) -> Any:
        return _DEFINED[name][2][0](*args)

    library.impl(text.split("(", 1)[0], run, "CPU")
    torch.library.register_fake(name, _fake(sig), lib=library)
    return library


def _define_custom_op(name: str, namespace: str, text: str, sig: Signature) -> Any:
    """The operator as an iree-turbine CustomOp (see the module's docstring)."""
    CustomOp: Any = op_reg.CustomOp
    impl_helper = op_reg.impl_helper
    library = op_reg.def_library(namespace)
    loader = _ProgramLoader(impl_helper.TemplateLoader)

    class PyreeKernel(CustomOp):  # type: ignore[misc]
        signature = text

        def select(self, ksel: Any) -> None:
            sizes: dict[str, Any] = {}
            for i, p in enumerate(sig.operands):
                if not p.is_buffer:
                    (ksel.attr_float if p.type.startswith("f") else ksel.attr_int)(i)
                    continue
                desc = ksel.arg_tensor(i)
                desc.specialize_dims(*[k for k, d in enumerate(p.dims or ()) if isinstance(d, int)])
                for d, extent in zip(p.dims or (), desc.t.shape):
                    if isinstance(d, str):
                        sizes.setdefault(d, extent)
            for p in sig.params:
                if p.kind == "out":
                    shape = [d if isinstance(d, int) else sizes[d] for d in p.dims or ()]
                    ksel.return_new_tensor(shape, _dtype(p)).specialize_dims(*[k for k, d in enumerate(p.dims or ()) if isinstance(d, int)])

        def eager_execute(self, *args: Any) -> Any:
            return _DEFINED[name][2][0](*args)

        def generate(self, ksel: Any, kb: Any) -> None:
            constants = {p.position: getattr(ksel.arg_descs[i], "v", None) for i, p in enumerate(sig.operands) if not p.is_buffer}
            function = f"pyree_{namespace}_{sig.function}_" + "_".join(
                f"{p.position}v{_mangled(v)}" for p, v in ((q, constants[q.position]) for q in sig.operands if not q.is_buffer)
            )
            func_op = loader.inline(kb, _program_with_constants(sig, constants, function.rstrip("_")), function.rstrip("_"))
            tensors = [kb.arg_bindings[i] for i, p in enumerate(sig.operands) if p.is_buffer]
            kb.yield_results(*impl_helper.call_function(func_op, *tensors))

    PyreeKernel.__name__ = sig.function
    CustomOp.register(library=library)(PyreeKernel)
    return library


def _mangled(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", repr(value))


class _ProgramLoader:
    """turbine's template loading, for a program text made here (no template file)."""

    def __init__(self, base: type) -> None:
        class Loader(base):  # type: ignore[misc]
            def load_template(self, kb: Any, name: str, **kwargs: Any) -> Any:
                return self._parse_module_asm(kb, kwargs["text"])

        self.loader = Loader()

    def inline(self, kb: Any, text: str, function: str) -> Any:
        return self.loader.inline_template_function(kb, function, function, text=text)


def _program_with_constants(sig: Signature, constants: dict[int, Any], function: str) -> str:
    """The signature's program, plus @FUNCTION taking only the tensors: each scalar is the
    constant the traced call passed."""
    text = signature_module.program(sig).replace(f"@{sig.function}_", f"@{function}__")
    text = text.replace(f"func.func @{sig.function}(", f"func.func private @{function}__host(")
    tensors = [p for p in sig.operands if p.is_buffer]
    params = ", ".join(f"%t{p.position}: {p.shaped('tensor')}" for p in tensors)
    outs = [p for p in sig.params if p.is_output]
    result_types = ", ".join(p.shaped("tensor") for p in outs)
    lines = []
    for p in sig.operands:
        if not p.is_buffer:
            value: Any = constants[p.position]
            value = float(value) if p.type.startswith("f") else int(value)
            lines.append(
                f"    %s{p.position} = arith.constant {value!r} : {p.type}"
                if p.type.startswith("f")
                else f"    %s{p.position} = arith.constant {value} : {p.type}"
            )
    call = ", ".join(f"%t{p.position}" if p.is_buffer else f"%s{p.position}" for p in sig.operands)
    call_types = ", ".join(p.shaped("tensor") if p.is_buffer else p.type for p in sig.operands)
    names = ", ".join(f"%r{i}" for i in range(len(outs)))
    wrapper = (
        f"  func.func @{function}({params}) -> ({result_types}) {{\n" + "\n".join(lines) + ("\n" if lines else "")
        + f"    {names} = func.call @{function}__host({call}) : ({call_types}) -> ({result_types})\n"
        f"    return {names} : {result_types}\n  }}\n"
    )  # fmt: skip
    return text.rstrip().removesuffix("}") + wrapper + "}\n"

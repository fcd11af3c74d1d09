"""The child side of asking a plugin what it resolves: IREE's executable-plugin ABI in ctypes.

Run in a forked child (imports.resolve): the plugin is loaded as the runtime loads it
(query, load with a host allocator, resolve, unload). ctypes, not cffi: cffi's cdef parse
alone costs ~65 ms of every run with a plugin. A module of its own so that ctypes and these
structures load only when a plugin is asked, not with every compile or run that reads imports.
"""

from __future__ import annotations

import ctypes as C
import os


class Header(C.Structure):
    _fields_ = [("version", C.c_uint32), ("name", C.c_char_p), ("description", C.c_char_p),
                ("features", C.c_uint32), ("sanitizer", C.c_int32), ("reserved", C.c_uint64 * 8)]  # fmt: skip


_CTL_T = C.CFUNCTYPE(C.c_size_t, C.c_void_p, C.c_int, C.c_void_p, C.POINTER(C.c_void_p))


class Allocator(C.Structure):
    _fields_ = [("self", C.c_void_p), ("ctl", _CTL_T)]


class Environment(C.Structure):
    _fields_ = [("host_allocator", Allocator)]


class ResolveParams(C.Structure):
    _fields_ = [("count", C.c_size_t), ("symbol_names", C.POINTER(C.c_char_p)),
                ("out_fn_ptrs", C.POINTER(C.c_void_p)), ("out_fn_contexts", C.POINTER(C.c_void_p))]  # fmt: skip


class Plugin(C.Structure):
    _fields_ = [
        ("header", C.POINTER(Header)),
        ("load", C.CFUNCTYPE(C.c_size_t, C.POINTER(Environment), C.c_size_t, C.c_void_p, C.POINTER(C.c_void_p))),
        ("unload", C.CFUNCTYPE(None, C.c_void_p)),
        ("resolve", C.CFUNCTYPE(C.c_size_t, C.c_void_p, C.POINTER(ResolveParams), C.POINTER(C.c_uint32))),
    ]


_LIBC = C.CDLL(None)
_LIBC.malloc.restype = _LIBC.calloc.restype = _LIBC.realloc.restype = C.c_void_p
_LIBC.malloc.argtypes = [C.c_size_t]
_LIBC.calloc.argtypes = [C.c_size_t, C.c_size_t]
_LIBC.realloc.argtypes = [C.c_void_p, C.c_size_t]
_LIBC.free.argtypes = [C.c_void_p]


def _host_allocator_ctl(self, command, params, inout_ptr):  # type: ignore[no-untyped-def] # the runtime's host allocator, for plugins that allocate
    size = C.cast(params, C.POINTER(C.c_size_t))[0] if params else 0
    if command == 0:
        inout_ptr[0] = _LIBC.malloc(size)
    elif command == 1:
        inout_ptr[0] = _LIBC.calloc(1, size)
    elif command == 2:
        inout_ptr[0] = _LIBC.realloc(inout_ptr[0], size)
    elif command == 3:
        _LIBC.free(inout_ptr[0])
        return 0
    return 0 if inout_ptr[0] else 8


# A module-level callback object: it must stay alive as long as any plugin may call it.
_CTL_FN = _CTL_T(_host_allocator_ctl)


def ask(path: str, names: list[str]) -> dict[str, object]:
    """Load the plugin as the runtime does (query, load with a host allocator, resolve, unload)
    and return which of `names` it resolves."""
    try:
        lib = C.CDLL(path)
        query = lib.iree_hal_executable_plugin_query
    except (OSError, AttributeError) as exc:
        return {"error": f"cannot be loaded here ({exc})"}
    query.restype = C.POINTER(C.POINTER(Header))
    query.argtypes = [C.c_uint32, C.c_void_p]
    # query returns the plugin struct, seen through its first field (the header pointer).
    header_pp = query(1, None)
    if not header_pp or not header_pp[0]:
        return {"error": "its query function returned NULL for plugin ABI version 1"}
    plugin = C.cast(header_pp, C.POINTER(Plugin)).contents
    raw_name = header_pp[0].contents.name
    name = raw_name.decode("utf-8", "replace") if raw_name else ""
    env = Environment()
    env.host_allocator.ctl = _CTL_FN
    self_p = C.c_void_p()
    status = plugin.load(C.byref(env), 0, None, C.byref(self_p))
    if status:
        return {"name": name, "error": f"its load returned status code {status & 0x1F}"}
    resolved = _resolve(plugin, self_p, names)
    plugin.unload(self_p)
    return {"name": name, "resolves": resolved}


def _resolve(plugin: Plugin, self_p: C.c_void_p, names: list[str]) -> list[str]:
    """The names the loaded plugin fills in; the runtime passes them sorted, optional ones with their `?`."""
    keep = sorted(names)
    count = len(keep)
    symbols = (C.c_char_p * max(1, count))(*[n.encode() for n in keep])
    fn_ptrs = (C.c_void_p * max(1, count))()
    fn_contexts = (C.c_void_p * max(1, count))()
    params = ResolveParams(count, C.cast(symbols, C.POINTER(C.c_char_p)), C.cast(fn_ptrs, C.POINTER(C.c_void_p)), C.cast(fn_contexts, C.POINTER(C.c_void_p)))
    resolution = C.c_uint32()
    plugin.resolve(self_p, C.byref(params), C.byref(resolution))
    return [keep[i] for i in range(count) if fn_ptrs[i]]


def ask_quietly(path: str, names: list[str]) -> dict[str, object]:
    """`ask` in the forked child, the plugin's own prints kept out of pyree_build's output."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    return ask(path, names)

"""What a module's Vulkan executables assume of the device that runs them.

iree-compile's GPU targets write SPIR-V whose subgroup operations (reductions, shuffles)
assume the target's subgroup size, and the module records neither the target nor that size
(a pipeline's required subgroup size stays 0). Run on a device with smaller subgroups, the
shaders compute wrong numbers and the run exits 0: an `rdna3` reduction of 1024 ones gives
256 on lavapipe (8-lane subgroups), a `valhall` one NaN. Every iree-compile 3.13 Vulkan
target that emits subgroup operations assumes 16, 32 or 64 lanes (tests/backends/vulkan/test_vulkan.py
compiles for each), and the targets for devices with smaller subgroups emit none; so a
module with subgroup operations on a device whose subgroups are all smaller than 16 lanes
was compiled for another device, and `run` refuses it rather than print wrong numbers.
Except for the llvmpipe target (what `auto` picks on lavapipe): its reductions use subgroup
operations written for 8 lanes, lavapipe's own size, and compute right there. The module names
its target's subgroup sizes (iree-compile writes the target into it), and those are the ones
the check holds the device to.
"""

from __future__ import annotations

import array
import contextlib
import re
import sys
from pathlib import Path

from pyree_build.backends.vulkan import devices
from pyree_build.core.errors import PyreeError
from pyree_build.core.flatbuffers import Table
from pyree_build.core.records import record

# The smallest subgroup size any iree-compile 3.13 Vulkan target's subgroup operations assume.
SMALLEST_ASSUMED_SUBGROUP = 16

_FILE_IDENTIFIER = b"VKE1"  # iree.hal.vulkan.ExecutableDef
_SPIRV_MAGIC = 0x07230203
_OP_CAPABILITY = 17
# The SPIR-V generator id of MLIR's serializer, which iree-compile's code comes from. A
# shader a user wrote (glslang's id is 8) is theirs to make portable (gl_SubgroupSize), so
# only generated code is held to its target's subgroup size.
_MLIR_GENERATOR = 22
# SPIR-V capabilities whose operations depend on how many invocations a subgroup has
# (GroupNonUniform itself only elects and asks the size, which is portable).
_SUBGROUP_CAPABILITIES = {
    62: "GroupNonUniformVote", 63: "GroupNonUniformArithmetic", 64: "GroupNonUniformBallot",
    65: "GroupNonUniformShuffle", 66: "GroupNonUniformShuffleRelative", 67: "GroupNonUniformClustered",
    68: "GroupNonUniformQuad", 4423: "SubgroupBallotKHR", 4431: "SubgroupVoteKHR", 6022: "CooperativeMatrixKHR",
}  # fmt: skip


@record(frozen=True)
class VulkanPipeline:
    entry_point: str
    required_subgroup_size: int  # 0: the pipeline asks for none (its code may still assume one)
    subgroup_capabilities: tuple[str, ...]  # of the code iree-compile generated


def subgroup_capabilities(spirv: bytes) -> tuple[str, ...]:
    """The size-dependent subgroup capabilities a SPIR-V module that iree-compile generated
    declares (they come first); none for a shader from another compiler."""
    words = array.array("I", spirv[: len(spirv) - len(spirv) % 4])
    if sys.byteorder != "little":
        words.byteswap()
    if len(words) < 5 or words[0] != _SPIRV_MAGIC:
        raise ValueError("not SPIR-V")
    if words[2] >> 16 != _MLIR_GENERATOR:
        return ()
    found = []
    at = 5
    while at + 1 < len(words) and words[at] & 0xFFFF == _OP_CAPABILITY:
        found.append(_SUBGROUP_CAPABILITIES.get(words[at + 1], ""))
        at += max(words[at] >> 16, 1)
    return tuple(name for name in found if name)


def _executable_pipelines(data: bytes, at: int) -> list[VulkanPipeline]:
    executable = Table.root(data, at)
    shaders = [subgroup_capabilities(shader.u32_bytes(0)) for shader in executable.tables(3)]
    pipelines = []
    for pipeline in executable.tables(0):
        ordinal = pipeline.u32(0)
        if ordinal >= len(shaders):
            raise ValueError("a pipeline names a shader module that is not there")
        pipelines.append(VulkanPipeline(pipeline.string(1), pipeline.u32(3), shaders[ordinal]))
    return pipelines


def pipelines(data: bytes) -> list[VulkanPipeline]:
    """The pipelines of every Vulkan executable a module embeds (found by their FlatBuffer
    identifier, which follows the root offset; candidates that do not parse are skipped)."""
    found: list[VulkanPipeline] = []
    at = data.find(_FILE_IDENTIFIER, 4)
    while at >= 0:
        with contextlib.suppress(ValueError):
            found += _executable_pipelines(data, at - 4)
        at = data.find(_FILE_IDENTIFIER, at + 1)
    return found


# The subgroup sizes the module's Vulkan target was compiled for, as iree-compile 3.13 writes the
# target into the module (in the message for a device that has none of its formats).
_DECLARED_SUBGROUPS = re.compile(rb'"vulkan-spirv-fb".{0,4000}?subgroup_size_choices = \[([0-9, ]+)\]', re.DOTALL)


def declared_subgroup_sizes(data: bytes) -> list[int]:
    """The subgroup sizes the module's Vulkan code was generated for ([] where it does not say)."""
    return sorted({int(n) for found in _DECLARED_SUBGROUPS.findall(data) for n in found.split(b",") if n.strip()})


def _problem(pipeline: VulkanPipeline, device: devices.VulkanDevice, assumed: int = SMALLEST_ASSUMED_SUBGROUP) -> str | None:
    low, high = device.subgroup_sizes
    if pipeline.required_subgroup_size:
        if low <= pipeline.required_subgroup_size <= high:
            return None
        return f"requires subgroups of {pipeline.required_subgroup_size} lanes"
    if pipeline.subgroup_capabilities and 0 < high < assumed:
        return (
            f"uses subgroup operations ({', '.join(pipeline.subgroup_capabilities)}) written for a GPU's subgroups "
            f"(iree-compile's GPU targets assume {assumed}, 32 or 64 lanes)"
        )
    return None


def check_runs_on(module: Path, device: str) -> None:
    """Refuse a module whose Vulkan code would compute wrong results on `device`."""
    here = devices.named(device)
    if here is None:
        return
    data = module.read_bytes()
    # The code assumes the smallest subgroup its target declares (llvmpipe's: 8, lavapipe's own
    # size, so IREE's reductions for it run right there); a module that does not say, 16 or more.
    declared = declared_subgroup_sizes(data)
    assumed = declared[0] if declared else SMALLEST_ASSUMED_SUBGROUP
    for pipeline in pipelines(data):
        problem = _problem(pipeline, here, assumed)
        if problem is None:
            continue
        low, high = here.subgroup_sizes
        lanes = f"{low}" if low == high else f"{low} to {high}"
        raise PyreeError(
            f"this module's Vulkan code was compiled for another device and would compute wrong results on "
            f"{here.name}: dispatch {pipeline.entry_point} {problem}, and this device's subgroups have {lanes} lanes",
            file=module,
            fix=f"compile it for this device (--vulkan-target auto, which is {devices.target_for(here)} here; "
            "CMake VULKAN_TARGET auto), or run it on the GPU it was compiled for",
        )

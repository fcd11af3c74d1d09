# The pyree_* functions. Each one declares which files go in, which come out and which
# `pyree-build` verb makes them; it holds no compiler flags (those live in Python, so the
# CLI, the Python API and CMake produce identical outputs). Every action writes a depfile
# listing the sources, included headers, tools and pyree_build itself, so Ninja rebuilds
# an output when any of them changes and not otherwise.
include_guard(GLOBAL)

cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...), also in projects that ask for an old CMake
if(POLICY CMP0116)
  cmake_policy(SET CMP0116 NEW)  # depfiles hold absolute paths
endif()

# Every action and test runs `pyree-build` through the native client when it can be built
# (~1 ms to start, where a Python client costs a Python start-up): it hands the command to the
# per-user pyree_build server. Built once a configure, into this build tree (a stat when it is
# up to date); PYREE_BUILD_NATIVE_CLIENT=OFF, or a failed build, keeps the Python client.
option(PYREE_BUILD_NATIVE_CLIENT "run pyree-build through the native client (Linux; it hands each command to the per-user server unless PYREE_BUILD_SERVER=off)" ON)
set(PYREE_BUILD_COMMAND "${PYREE_BUILD_PYTHON}" -m pyree_build)
if(PYREE_BUILD_NATIVE_CLIENT AND CMAKE_HOST_SYSTEM_NAME STREQUAL "Linux")
  execute_process(
    COMMAND "${PYREE_BUILD_PYTHON}" -m pyree_build --native-client "${CMAKE_BINARY_DIR}/pyree_build_client"
    WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}"  # not cmake's: -m imports from the current directory first
    RESULT_VARIABLE _pyree_rc OUTPUT_VARIABLE _pyree_client ERROR_VARIABLE _pyree_err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_pyree_rc EQUAL 0 AND EXISTS "${_pyree_client}")
    set(PYREE_BUILD_COMMAND "${_pyree_client}")
  else()
    message(STATUS "pyree_build: no native client (${_pyree_err}); each action starts `${PYREE_BUILD_PYTHON} -m pyree_build`")
  endif()
endif()
# Exit code `pyree-build run --skip-unavailable` uses when the device (a GPU) is absent.
set(PYREE_BUILD_SKIP_CODE 77)

# Every artifact joins iree-sample-deps, as in IREE's own build.
function(_pyree_register target)
  if(NOT TARGET iree-sample-deps)
    add_custom_target(iree-sample-deps COMMENT "Building IREE sample data targets")
  endif()
  add_dependencies(iree-sample-deps ${target})
endfunction()

# Values the CLI accepts, checked at configure time rather than at build or test time.
set(PYREE_BUILD_ARCHS x86_64 aarch64 riscv64 arm_64 arm64 riscv_64)
# Targets and devices are the backend registry's (pyree_build/backends), asked once per configure,
# so a backend installed as a package is a valid TARGET / DEVICE with no edit here.
if(NOT DEFINED PYREE_BUILD_TARGETS OR NOT DEFINED PYREE_BUILD_DEVICES)
  execute_process(
    COMMAND "${PYREE_BUILD_PYTHON}" -c "import pyree_build.backends as b; print(','.join(b.names()), ','.join(b.devices()), sep='|', end='')"
    WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}"  # not cmake's: -c imports from the current directory first
    RESULT_VARIABLE _pyree_rc OUTPUT_VARIABLE _pyree_registry ERROR_VARIABLE _pyree_err)
  if(NOT _pyree_rc EQUAL 0)
    message(FATAL_ERROR "pyree_build: reading the backend registry with ${PYREE_BUILD_PYTHON} failed:\n${_pyree_err}\nReinstall pyree_build (pip install .) or point -DPYREE_BUILD_PYTHON at the Python that has it.")
  endif()
  string(REPLACE "|" ";" _pyree_registry_parts "${_pyree_registry}")
  list(GET _pyree_registry_parts 0 _pyree_targets)
  list(GET _pyree_registry_parts 1 _pyree_devices)
  string(REPLACE "," ";" PYREE_BUILD_TARGETS "${_pyree_targets}")
  string(REPLACE "," ";" PYREE_BUILD_DEVICES "${_pyree_devices}")
endif()
# Multi-value keywords whose values are free text (macro names, flags, labels, symbols,
# FileCheck prefixes), so never taken for misspelled keywords.
set(_PYREE_FREE_TEXT_KEYWORDS DEFINES FLAGS LABELS ALLOW_UNDEFINED CHECK_PREFIXES EXPECT_IMPORTS)

# cmake_parse_arguments(ARG ...) that also stops at configure time on an unknown keyword, a
# keyword given without its value, or a value that looks like a misspelled keyword (with a
# multi-value keyword before it, `INCLUDE_DIR inc` would silently become two more SRCS). The
# keyword lists are the only place a keyword is declared: adding one is one edit there.
macro(_pyree_parse fn options one_value multi_value)
  cmake_parse_arguments(ARG "${options}" "${one_value}" "${multi_value}" ${ARGN})
  set(_pyree_keywords ${options} ${one_value} ${multi_value})
  list(JOIN _pyree_keywords " " _pyree_valid)
  if(ARG_UNPARSED_ARGUMENTS)
    list(JOIN ARG_UNPARSED_ARGUMENTS " " _pyree_bad)
    message(FATAL_ERROR "${fn}: unknown argument(s) '${_pyree_bad}' (a misspelled keyword?). Valid keywords: ${_pyree_valid}")
  endif()
  if(ARG_KEYWORDS_MISSING_VALUES)
    list(JOIN ARG_KEYWORDS_MISSING_VALUES " " _pyree_bad)
    message(FATAL_ERROR "${fn}: keyword(s) given without a value: ${_pyree_bad}. Valid keywords: ${_pyree_valid}")
  endif()
  foreach(_pyree_kw IN ITEMS ${multi_value})
    if(_pyree_kw IN_LIST _PYREE_FREE_TEXT_KEYWORDS)
      continue()
    endif()
    foreach(_pyree_value IN LISTS ARG_${_pyree_kw})
      if(_pyree_value MATCHES "^[A-Z][A-Z0-9_]+$")
        foreach(_pyree_known IN ITEMS ${_pyree_keywords})
          string(FIND "${_pyree_value}" "${_pyree_known}" _pyree_a)
          string(FIND "${_pyree_known}" "${_pyree_value}" _pyree_b)
          if(_pyree_a EQUAL 0 OR _pyree_b EQUAL 0)
            message(FATAL_ERROR "${fn}: '${_pyree_value}' among the ${_pyree_kw} values looks like a misspelled keyword "
                                "(${_pyree_known}?). Valid keywords: ${_pyree_valid}")
          endif()
        endforeach()
      endif()
    endforeach()
  endforeach()
endmacro()

# Stops unless every value of ARG_<keyword> is one of `allowed` (a list).
function(_pyree_one_of fn keyword allowed)
  foreach(_value IN LISTS ARG_${keyword})
    string(REGEX REPLACE ":.*" "" _base "${_value}")  # cuda://0 and cuda:0 name the cuda driver
    if(NOT _base IN_LIST allowed)
      list(JOIN allowed ", " _list)
      message(FATAL_ERROR "${fn}: unknown ${keyword} '${_value}'; use one of: ${_list}")
    endif()
  endforeach()
endfunction()

# Stops unless each path (relative to this source directory) exists or is made by the build.
function(_pyree_require_files fn keyword)
  foreach(_path IN LISTS ARGN)
    get_filename_component(_abs "${_path}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    get_source_file_property(_generated "${_abs}" GENERATED)
    if(NOT EXISTS "${_abs}" AND NOT _generated)
      message(FATAL_ERROR "${fn}: ${keyword} file '${_path}' not found (looked for ${_abs})")
    endif()
  endforeach()
endfunction()

function(_pyree_require fn)
  foreach(_arg IN LISTS ARGN)
    if(NOT ARG_${_arg})
      message(FATAL_ERROR "${fn}: ${_arg} is required")
    endif()
  endforeach()
endfunction()

function(_pyree_absolute out_var)
  set(_result "")
  foreach(_path IN LISTS ARGN)
    get_filename_component(_abs "${_path}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND _result "${_abs}")
  endforeach()
  set(${out_var} "${_result}" PARENT_SCOPE)
endfunction()

# A pyree_* target name resolves to its output file; anything else is a path, which must
# exist (relative to the build directory, then the source directory) or be made by the build.
function(_pyree_artifact item out_var)
  if(TARGET "${item}")
    get_target_property(_out "${item}" PYREE_OUTPUT)
    if(NOT _out)
      message(FATAL_ERROR "target '${item}' is not a pyree_* artifact (it has no PYREE_OUTPUT)")
    endif()
    set(${out_var} "${_out}" PARENT_SCOPE)
  else()
    get_filename_component(_abs "${item}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    get_filename_component(_in_source "${item}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    get_source_file_property(_generated "${_abs}" GENERATED)
    if(NOT EXISTS "${_abs}" AND NOT _generated AND EXISTS "${_in_source}")
      set(_abs "${_in_source}")
    elseif(NOT EXISTS "${_abs}" AND NOT _generated)
      message(FATAL_ERROR "'${item}' is neither a pyree_* target defined before this call nor an existing file "
                          "(looked for ${_abs} and ${_in_source}); define the target first, or give the file's path")
    endif()
    set(${out_var} "${_abs}" PARENT_SCOPE)
  endif()
endfunction()

# A program (.mlir) from a pyree_onnx_import target or a path: out_var is its MLIR, files_var
# every file its compile reads besides objects and specs: the MLIR and the archive of weights
# beside it (<stem>_params.irpa, which the compile imports into the module) where there is one.
function(_pyree_program item out_var files_var)
  _pyree_artifact("${item}" _files)
  list(GET _files 0 _mlir)
  get_filename_component(_dir "${_mlir}" DIRECTORY)
  get_filename_component(_stem "${_mlir}" NAME_WLE)
  if(NOT TARGET "${item}" AND EXISTS "${_dir}/${_stem}_params.irpa")
    list(APPEND _files "${_dir}/${_stem}_params.irpa")
  endif()
  set(${out_var} "${_mlir}" PARENT_SCOPE)
  set(${files_var} "${_files}" PARENT_SCOPE)
endfunction()

# Appends `--timeout ARG_TIMEOUT` (seconds; the CLI's default bounds a run otherwise).
macro(_pyree_timeout fn args_var)
  if(DEFINED ARG_TIMEOUT)
    if(NOT ARG_TIMEOUT MATCHES "^[0-9]*\\.?[0-9]+$" OR ARG_TIMEOUT EQUAL 0)
      message(FATAL_ERROR "${fn}: TIMEOUT '${ARG_TIMEOUT}' is not a positive number of seconds")
    endif()
    list(APPEND ${args_var} --timeout "${ARG_TIMEOUT}")
  endif()
endmacro()

# Appends --input/--plugin arguments for ARG_INPUTS and ARG_PLUGINS (targets or files).
macro(_pyree_inputs_and_plugins args_var)
  foreach(_input IN LISTS ARG_INPUTS)
    list(APPEND ${args_var} --input "${_input}")
  endforeach()
  foreach(_plugin IN LISTS ARG_PLUGINS)
    _pyree_artifact("${_plugin}" _plugin_file)
    list(APPEND ${args_var} --plugin "${_plugin_file}")
  endforeach()
endmacro()

# A shared remote cache behind the local one (docs/cache-and-rebuilds.md: "Sharing a cache between machines").
# Empty: the environment's PYREE_BUILD_REMOTE_CACHE applies, if any. Credentials belong in the
# environment (PYREE_BUILD_REMOTE_CACHE_TOKEN / _AUTH, and the signing secret
# PYREE_BUILD_REMOTE_CACHE_KEY), never here: this ends up in build.ninja.
set(PYREE_BUILD_REMOTE_CACHE "" CACHE STRING "http(s)://host/path of a shared pyree_build cache (HTTP GET/PUT)")
set(PYREE_BUILD_REMOTE_CACHE_MODE "" CACHE STRING "read: use the remote cache's hits, upload nothing")

# Runs `pyree-build <verb> <ARGN>` to make `outputs` (a list) from `depends`, with a depfile
# beside the first output so Ninja also tracks the headers, tools and pyree_build itself.
function(_pyree_action outputs depends comment verb)
  list(GET outputs 0 _first)
  # An output that is also an input is a Ninja dependency cycle at build time (and the build
  # would destroy the input): refused here, where the call is, for every pyree_* function.
  foreach(_written IN LISTS outputs ITEMS "${_first}.d")
    get_filename_component(_written_real "${_written}" REALPATH)
    foreach(_read IN LISTS depends)
      get_filename_component(_read_real "${_read}" REALPATH)
      if(_written_real STREQUAL _read_real)
        message(FATAL_ERROR "pyree_build: ${comment}: the output ${_written} is also an input (${_read}): building "
                            "it would be a dependency cycle and would destroy the input. Choose another OUTPUT or OUTPUT_DIR.")
      endif()
    endforeach()
  endforeach()
  set(_env "")
  foreach(_var IN ITEMS PYREE_BUILD_REMOTE_CACHE PYREE_BUILD_REMOTE_CACHE_MODE)
    if(${_var})
      list(APPEND _env "${_var}=${${_var}}")
    endif()
  endforeach()
  if(_env)
    set(_env "${CMAKE_COMMAND}" -E env ${_env})
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND ${_env} ${PYREE_BUILD_COMMAND} ${verb} -q --depfile "${_first}.d" ${ARGN}
    DEPENDS ${depends}
    DEPFILE "${_first}.d"
    COMMENT "pyree_build: ${comment}"
    VERBATIM)
endfunction()

# The target `name` building `outputs` (in ALL and iree-sample-deps); `object_dir`, when not
# empty, is where a module that DEPENDS on it looks for objects.
function(_pyree_artifact_target name outputs object_dir)
  add_custom_target(${name} ALL DEPENDS ${outputs})
  set_target_properties(${name} PROPERTIES PYREE_OUTPUT "${outputs}")
  if(object_dir)
    set_target_properties(${name} PROPERTIES PYREE_OBJECT_DIR "${object_dir}")
  endif()
  _pyree_register(${name})
endfunction()

# Where an artifact function writes: OUTPUT_DIR (relative to the binary dir: where a
# program's relative object paths point) if its caller was given one, else <binary dir>/<name>.
function(_pyree_output_dir out_var name)
  if(ARG_OUTPUT_DIR)
    get_filename_component(_dir "${ARG_OUTPUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(_dir "${CMAKE_CURRENT_BINARY_DIR}/${name}")
  endif()
  set(${out_var} "${_dir}" PARENT_SCOPE)
endfunction()

# One `pyree-build <verb>` per source in SRCS, each making one output per variant (arch or
# sm) in the artifact's output directory (_pyree_output_dir): `pattern` names them, with
# <stem> and <v> replaced. Creates the target <name>; its directory is an object search path.
function(_pyree_fan_out name verb label srcs variant_flag variants pattern)
  _pyree_output_dir(_dir ${name})
  set(_all "")
  foreach(_src IN LISTS srcs)
    get_filename_component(_stem "${_src}" NAME_WE)
    set(_outs "")
    set(_variant_flags "")
    foreach(_v IN LISTS variants)
      string(REPLACE "<stem>" "${_stem}" _out "${pattern}")
      string(REPLACE "<v>" "${_v}" _out "${_out}")
      list(APPEND _outs "${_dir}/${_out}")
      list(APPEND _variant_flags ${variant_flag} "${_v}")
    endforeach()
    _pyree_action("${_outs}" "${_src}" "${label} ${_stem} (${variants})" ${verb} ${ARGN} ${_variant_flags} "${_src}" -o "${_dir}")
    list(APPEND _all ${_outs})
  endforeach()
  _pyree_artifact_target(${name} "${_all}" "${_dir}")
endfunction()

function(_pyree_c_flags out_var)
  set(_flags "")
  if(ARG_CC)
    list(APPEND _flags --cc "${ARG_CC}")
  endif()
  _pyree_absolute(_dirs ${ARG_INCLUDE_DIRS})
  foreach(_dir IN LISTS _dirs)
    list(APPEND _flags -I "${_dir}")
  endforeach()
  foreach(_def IN LISTS ARG_DEFINES)
    list(APPEND _flags -D "${_def}")
  endforeach()
  set(${out_var} "${_flags}" PARENT_SCOPE)
endfunction()

# pyree_cpu_plugin(NAME <name> SYSTEM|STANDALONE SRCS <c>... [ARCHS x86_64 aarch64 riscv64]
#                  [OUTPUT <file>] [CC zig|clang|gcc] [INCLUDE_DIRS <dir>...] [DEFINES <d>...]
#                  [CPU baseline|host] [TUNED <best.json>|<pyree_tune target>])
# SYSTEM: a shared library for this host (<name>.so); CPU host builds for this CPU only. STANDALONE: freestanding ELFs, one per
# arch, linked by iree-lld and packed into a FatELF (<name>.sos; <name>.so for one arch). TUNED: build the variant a
# tune chose (its -D values are added to DEFINES; a new tune result rebuilds the plugin).
function(pyree_cpu_plugin)
  _pyree_parse(pyree_cpu_plugin "SYSTEM;STANDALONE" "NAME;OUTPUT;CC;CPU;TUNED" "SRCS;ARCHS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_cpu_plugin NAME SRCS)
  _pyree_require_files(pyree_cpu_plugin SRCS ${ARG_SRCS})
  _pyree_one_of(pyree_cpu_plugin ARCHS "${PYREE_BUILD_ARCHS}")
  if(ARG_SYSTEM AND ARG_STANDALONE OR NOT (ARG_SYSTEM OR ARG_STANDALONE))
    message(FATAL_ERROR "pyree_cpu_plugin(${ARG_NAME}): give exactly one of SYSTEM or STANDALONE")
  endif()
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  if(ARG_CPU)
    list(APPEND _flags --cpu "${ARG_CPU}")
  endif()
  if(ARG_SYSTEM)
    set(_kind system)
    set(_suffix .so)
  else()
    set(_kind standalone)
    list(LENGTH ARG_ARCHS _count)
    if(_count GREATER 1)
      set(_suffix .sos)
    else()
      set(_suffix .so)
    endif()
    foreach(_arch IN LISTS ARG_ARCHS)
      list(APPEND _flags --arch "${_arch}")
    endforeach()
  endif()
  if(ARG_OUTPUT)
    get_filename_component(_out "${ARG_OUTPUT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}${_suffix}")
  endif()
  set(_verb plugin)
  set(_depends "${_srcs}")
  if(ARG_TUNED)
    _pyree_artifact("${ARG_TUNED}" _tuned)
    set(_verb tune --apply "${_tuned}")
    list(APPEND _depends "${_tuned}")
    if(TARGET "${ARG_TUNED}")
      list(APPEND _depends "${ARG_TUNED}")
    endif()
  endif()
  _pyree_action("${_out}" "${_depends}" "${_kind} plugin ${ARG_NAME}" ${_verb} --kind ${_kind} ${_flags} ${_srcs} -o "${_out}")
  _pyree_artifact_target(${ARG_NAME} "${_out}" "")
endfunction()

# pyree_tune(NAME <name> SYSTEM|STANDALONE SRCS <c>... [PARAMS <NAME=V1,V2,...>...] MODULE <target-or-file>
#            [PLUGINS <target-or-file>...] FUNCTION <f> [INPUTS <spec>...] REFERENCE <target-or-file> | ONNX <model> | EXPECT_OUTPUT <spec>...
#            [ARCHS ...] [CC ...] [CPU baseline|host] [DEVICE <device>] [INCLUDE_DIRS ...] [DEFINES ...]
#            [BUDGET <s>] [TIMEOUT <s>] [MAX_ROUNDS <n>])
# pyree_tune(NAME <name> TARGET vulkan|cuda|hip SRCS <kernel> PROGRAM <target-or-file> SPEC <spec.mlir>
#            FUNCTION <f> [VULKAN_TARGET <t>|SM <sm>|GFX <gfx>] ... as above, without MODULE)
# Sweeps the kernel's -D parameters with `pyree-build tune` and writes <name>.json in the binary dir
# (without PARAMS: the knobs the sources declare, `// pyree-tune: NAME=V1,V2` lines as `replace` writes):
# pyree_cpu_plugin(... TUNED <name>) then builds the variant it chose. TARGET: a GPU kernel (what
# `replace --target` writes), each variant compiled from PROGRAM with SPEC and run on the target's
# device; pyree_vulkan_spirv(... TUNED <name>) builds the chosen variant. PLUGINS: the module's
# other plugins (a model's other kernels), loaded with every variant; a new one tunes again.
function(pyree_tune)
  _pyree_parse(pyree_tune "SYSTEM;STANDALONE" "NAME;MODULE;FUNCTION;REFERENCE;ONNX;CC;CPU;DEVICE;BUDGET;TIMEOUT;MAX_ROUNDS;TARGET;PROGRAM;SPEC;VULKAN_TARGET;SM;GFX"
               "SRCS;PARAMS;INPUTS;EXPECT_OUTPUT;ARCHS;INCLUDE_DIRS;DEFINES;PLUGINS" ${ARGN})
  if(ARG_TARGET AND NOT ARG_TARGET STREQUAL "llvm-cpu")
    _pyree_require(pyree_tune NAME SRCS PROGRAM SPEC FUNCTION)
  else()
    _pyree_require(pyree_tune NAME SRCS MODULE FUNCTION)
  endif()
  _pyree_require_files(pyree_tune SRCS ${ARG_SRCS})
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  if(ARG_STANDALONE)
    list(APPEND _flags --kind standalone)
    foreach(_arch IN LISTS ARG_ARCHS)
      list(APPEND _flags --arch "${_arch}")
    endforeach()
  endif()
  set(_depends ${_srcs})
  if(ARG_MODULE)
    _pyree_artifact("${ARG_MODULE}" _module)
    list(APPEND _depends "${_module}")
    list(APPEND _flags --module "${_module}")
  endif()
  foreach(_plugin IN LISTS ARG_PLUGINS)
    _pyree_artifact("${_plugin}" _plugin_file)
    list(APPEND _depends "${_plugin_file}")
    list(APPEND _flags --plugin "${_plugin_file}")
  endforeach()
  if(ARG_PROGRAM)  # a GPU kernel's: each variant compiles the program with the spec and its object
    _pyree_program("${ARG_PROGRAM}" _program _program_files)
    get_filename_component(_spec "${ARG_SPEC}" ABSOLUTE)
    list(APPEND _depends ${_program_files} "${_spec}")
    list(APPEND _flags --target "${ARG_TARGET}" --program "${_program}" --spec "${_spec}")
  endif()
  list(APPEND _flags --function "${ARG_FUNCTION}")
  if(ARG_REFERENCE)
    _pyree_artifact("${ARG_REFERENCE}" _reference)
    list(APPEND _flags --reference "${_reference}")
    list(APPEND _depends "${_reference}")
  endif()
  if(ARG_ONNX)
    _pyree_artifact("${ARG_ONNX}" _model)
    list(APPEND _flags --onnx "${_model}")
    list(APPEND _depends "${_model}")
  endif()
  foreach(_kw IN ITEMS PARAMS INPUTS EXPECT_OUTPUT)
    string(TOLOWER "${_kw}" _option)
    string(REPLACE "_" "-" _option "${_option}")
    string(REGEX REPLACE "s$" "" _option "${_option}")
    foreach(_value IN LISTS ARG_${_kw})
      list(APPEND _flags "--${_option}" "${_value}")
    endforeach()
  endforeach()
  foreach(_kw IN ITEMS CPU DEVICE BUDGET TIMEOUT MAX_ROUNDS VULKAN_TARGET SM GFX)
    if(ARG_${_kw})
      string(TOLOWER "${_kw}" _option)
      string(REPLACE "_" "-" _option "${_option}")
      list(APPEND _flags "--${_option}" "${ARG_${_kw}}")
    endif()
  endforeach()
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}.json")
  _pyree_action("${_out}" "${_depends}" "tune ${ARG_NAME}" tune ${_flags} ${_srcs} -o "${_out}")
  _pyree_artifact_target(${ARG_NAME} "${_out}" "")
endfunction()

# pyree_cpu_objects(NAME <name> SRCS <c>... ARCHS <arch>... [CC ...] [INCLUDE_DIRS ...]
#                   [DEFINES ...] [ALLOW_UNDEFINED <symbol>...] [OUTPUT_DIR <dir>])
# One freestanding object per source and arch in ${CMAKE_CURRENT_BINARY_DIR}/<name>/ (or
# OUTPUT_DIR, relative to the binary dir: where a program's relative object paths point),
# named <stem>_<arch>.o with the arch as spelled (arm_64 gives IREE's functions_arm_64.o);
# a module that DEPENDS on <name> finds them by search path.
function(pyree_cpu_objects)
  _pyree_parse(pyree_cpu_objects "" "NAME;CC;OUTPUT_DIR" "SRCS;ARCHS;INCLUDE_DIRS;DEFINES;ALLOW_UNDEFINED" ${ARGN})
  _pyree_require(pyree_cpu_objects NAME SRCS ARCHS)
  _pyree_require_files(pyree_cpu_objects SRCS ${ARG_SRCS})
  _pyree_one_of(pyree_cpu_objects ARCHS "${PYREE_BUILD_ARCHS}")
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  foreach(_sym IN LISTS ARG_ALLOW_UNDEFINED)
    list(APPEND _flags --allow-undefined "${_sym}")
  endforeach()
  _pyree_fan_out(${ARG_NAME} objects objects "${_srcs}" --arch "${ARG_ARCHS}" "<stem>_<v>.o" ${_flags})
endfunction()

# pyree_cuda_ptx(NAME <name> SRCS <cu>... SMS <sm>... [COMPILER nvrtc|nvcc] [VERIFY]
#                [PTX_ISA auto|native|<major.minor>] [INCLUDE_DIRS ...] [DEFINES ...] [OUTPUT_DIR <dir>])
# One PTX per source and sm in ${CMAKE_CURRENT_BINARY_DIR}/<name>/ (or OUTPUT_DIR), named <stem>_sm_<N>.ptx.
function(pyree_cuda_ptx)
  _pyree_parse(pyree_cuda_ptx "VERIFY" "NAME;COMPILER;PTX_ISA;OUTPUT_DIR" "SRCS;SMS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_cuda_ptx NAME SRCS SMS)
  _pyree_require_files(pyree_cuda_ptx SRCS ${ARG_SRCS})
  foreach(_sm IN LISTS ARG_SMS)
    if(NOT _sm MATCHES "^(sm_)?[0-9]+[a-z]?$")
      message(FATAL_ERROR "pyree_cuda_ptx: SMS value '${_sm}' is not an sm number (e.g. 80 or sm_80)")
    endif()
  endforeach()
  _pyree_absolute(_srcs ${ARG_SRCS})
  set(_flags "")
  if(ARG_COMPILER)
    list(APPEND _flags --compiler "${ARG_COMPILER}")
  endif()
  if(ARG_PTX_ISA)
    list(APPEND _flags --ptx-isa "${ARG_PTX_ISA}")
  endif()
  if(ARG_VERIFY)
    list(APPEND _flags --verify)
  endif()
  _pyree_c_flags(_c_flags)  # -I and -D mean the same to nvcc and NVRTC
  list(TRANSFORM ARG_SMS REPLACE "^sm_" "")
  _pyree_fan_out(${ARG_NAME} ptx PTX "${_srcs}" --sm "${ARG_SMS}" "<stem>_sm_<v>.ptx" ${_flags} ${_c_flags})
endfunction()

# pyree_cuda_bitcode(NAME <name> SRCS <cu>... SMS <sm>... [INCLUDE_DIRS <dir>...] [DEFINES <d>...]
#                    [OUTPUT_DIR <dir>])
# NVPTX LLVM bitcode per source and sm in ${CMAKE_CURRENT_BINARY_DIR}/<name>/ (or OUTPUT_DIR), named
# <stem>_sm_<N>.bc (no CUDA SDK), for pyree_iree_module(... TARGET cuda LINK_BITCODE <name>), which
# links the files of its SM.
function(pyree_cuda_bitcode)
  _pyree_parse(pyree_cuda_bitcode "" "NAME;OUTPUT_DIR" "SRCS;SMS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_cuda_bitcode NAME SRCS SMS)
  _pyree_require_files(pyree_cuda_bitcode SRCS ${ARG_SRCS})
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  list(TRANSFORM ARG_SMS REPLACE "^sm_" "")
  _pyree_fan_out(${ARG_NAME} bitcode "CUDA bitcode" "${_srcs}" --sm "${ARG_SMS}" "<stem>_sm_<v>.bc" ${_flags})
endfunction()

# pyree_vulkan_spirv(NAME <name> SRCS <glsl>... [COMPILER glslang|glslc]
#                    [INCLUDE_DIRS <dir>...] [DEFINES <d>...] [OUTPUT_DIR <dir>]
#                    [TUNED <best.json>|<pyree_tune target> [SPEC <spec.mlir>]])
# One validated SPIR-V module per GLSL compute shader in ${CMAKE_CURRENT_BINARY_DIR}/<name>/ (or
# OUTPUT_DIR), named <stem>.spv; a module that DEPENDS on <name> finds them by search path. TUNED
# (one shader): the variant a `pyree_tune(... TARGET vulkan)` chose (a new tune result rebuilds it),
# and <dir>/spec.mlir: SPEC (default: the spec the tune used) with the winner's workgroup count,
# the spec to compile the module with (another TUNED call's spec.mlir as SPEC holds both choices).
function(pyree_vulkan_spirv)
  _pyree_parse(pyree_vulkan_spirv "" "NAME;COMPILER;OUTPUT_DIR;TUNED;SPEC" "SRCS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_vulkan_spirv NAME SRCS)
  _pyree_require_files(pyree_vulkan_spirv SRCS ${ARG_SRCS})
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)  # -I and -D mean the same to glslang and glslc
  if(ARG_SPEC AND NOT ARG_TUNED)
    message(FATAL_ERROR "pyree_vulkan_spirv(${ARG_NAME}): SPEC goes with TUNED (the spec the tuned workgroup count is written into)")
  endif()
  _pyree_output_dir(_dir ${ARG_NAME})
  set(_all "")
  if(ARG_TUNED)
    list(LENGTH _srcs _count)
    if(ARG_COMPILER)
      message(FATAL_ERROR "pyree_vulkan_spirv(${ARG_NAME}): TUNED builds with glslang, as the tune built its variants; leave out COMPILER")
    endif()
    if(NOT _count EQUAL 1)
      message(FATAL_ERROR "pyree_vulkan_spirv(${ARG_NAME}): TUNED builds one shader (a tune sweeps one kernel); give one SRCS per call")
    endif()
    _pyree_artifact("${ARG_TUNED}" _tuned)
    get_filename_component(_stem "${_srcs}" NAME_WE)
    set(_depends "${_srcs}" "${_tuned}")
    if(TARGET "${ARG_TUNED}")
      list(APPEND _depends "${ARG_TUNED}")
    endif()
    if(ARG_SPEC)
      get_filename_component(_spec "${ARG_SPEC}" ABSOLUTE)
      list(APPEND _depends "${_spec}")
      list(APPEND _flags --spec "${_spec}")
    endif()
    _pyree_action("${_dir}/${_stem}.spv;${_dir}/spec.mlir" "${_depends}" "SPIR-V ${_stem} (tuned)" tune --target vulkan --apply "${_tuned}" ${_flags}
                  "${_srcs}" -o "${_dir}")
    _pyree_artifact_target(${ARG_NAME} "${_dir}/${_stem}.spv;${_dir}/spec.mlir" "${_dir}")
    return()
  endif()
  if(ARG_COMPILER)
    list(APPEND _flags --compiler "${ARG_COMPILER}")
  endif()
  foreach(_src IN LISTS _srcs)
    get_filename_component(_stem "${_src}" NAME_WE)
    _pyree_action("${_dir}/${_stem}.spv" "${_src}" "SPIR-V ${_stem}" spirv ${_flags} "${_src}" -o "${_dir}")
    list(APPEND _all "${_dir}/${_stem}.spv")
  endforeach()
  _pyree_artifact_target(${ARG_NAME} "${_all}" "${_dir}")
endfunction()

# pyree_hip_hsaco(NAME <name> SRCS <cu|hip>... GFX <gfx>... [INCLUDE_DIRS <dir>...] [DEFINES <d>...]
#                 [OUTPUT_DIR <dir>] [LAYOUT dirs|flat])
# One AMDGPU code object per source and gfx in ${CMAKE_CURRENT_BINARY_DIR}/<name>/ (or OUTPUT_DIR),
# named gfx<N>/<stem>.co (LAYOUT flat: <stem>_gfx<N>.co, the names IREE's samples reference), each
# checked to be for its gfx. A module with TARGET hip and GFX <N> that DEPENDS on <name> takes the
# objects of its own gfx.
function(pyree_hip_hsaco)
  _pyree_parse(pyree_hip_hsaco "" "NAME;OUTPUT_DIR;LAYOUT" "SRCS;GFX;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_hip_hsaco NAME SRCS GFX)
  _pyree_require_files(pyree_hip_hsaco SRCS ${ARG_SRCS})
  _pyree_one_of(pyree_hip_hsaco LAYOUT "dirs;flat")
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  list(TRANSFORM ARG_GFX REPLACE "^gfx" "")
  set(_pattern "gfx<v>/<stem>.co")
  if(ARG_LAYOUT STREQUAL "flat")
    set(_pattern "<stem>_gfx<v>.co")
    list(APPEND _flags --layout flat)
  endif()
  _pyree_fan_out(${ARG_NAME} hsaco "HIP code objects" "${_srcs}" --gfx "${ARG_GFX}" "${_pattern}" ${_flags})
endfunction()

# pyree_iree_module's VULKAN_TARGET, GFX and LINK_BITCODE (a pyree_cuda_bitcode target or a file).
macro(_pyree_gpu_module_args args_var deps_var)
  set(${deps_var} "")
  if(ARG_VULKAN_TARGET)
    list(APPEND ${args_var} --vulkan-target "${ARG_VULKAN_TARGET}")
  endif()
  if(ARG_GFX)
    list(APPEND ${args_var} --gfx "${ARG_GFX}")
  endif()
  foreach(_bc IN LISTS ARG_LINK_BITCODE)
    if(TARGET "${_bc}")
      list(APPEND ARG_DEPENDS "${_bc}")  # build order; its output also becomes a file dependency
    endif()
    _pyree_artifact("${_bc}" _bc_files)
    if(TARGET "${_bc}")
      # A pyree_cuda_bitcode target holds one file per sm: link those of this module's sm.
      set(_bc_sm "${ARG_SM}")
      if(NOT _bc_sm)
        set(_bc_sm 80)
      endif()
      string(REGEX REPLACE "^sm_" "" _bc_sm "${_bc_sm}")
      list(FILTER _bc_files INCLUDE REGEX "_sm_${_bc_sm}\\.bc$")
      if(NOT _bc_files)
        message(FATAL_ERROR "pyree_iree_module(${ARG_NAME}): LINK_BITCODE ${_bc} has no bitcode for sm_${_bc_sm}; add ${_bc_sm} to its SMS")
      endif()
    endif()
    foreach(_bc_file IN LISTS _bc_files)
      list(APPEND ${args_var} --link-bitcode "${_bc_file}")
      list(APPEND ${deps_var} "${_bc_file}")
    endforeach()
  endforeach()
endmacro()

# pyree_iree_module(NAME <name> SRC <mlir-or-pyree_onnx_import-target> TARGET llvm-cpu|cuda|vulkan|hip [SM <sm>] [CPU generic|host]
#                   [VULKAN_TARGET auto|<name>] [GFX <gfx>] [LINK_BITCODE <target-or-file>...]
#                   [OBJECT_SEARCH_PATHS <dir>...] [DEPENDS <target-or-file>...]
#                   [SUBSTITUTE <executable>=<file>...] [FLAGS <iree-compile flag>...] [OUTPUT <file>]
#                   [TRANSFORM_SPEC <spec.mlir>] [PDL_SPEC <spec.mlir>] [EXPECT_IMPORTS <name>...]
#                   [PREPROCESS <iree-opt pass pipeline>])
# Compiles to <name>.vmfb. A DEPENDS entry that is a pyree_cuda_ptx or pyree_cpu_objects
# target also adds its output directory to the object search paths. SUBSTITUTE replaces an
# executable by a file (relative to this directory): .mlir as source, anything else as object.
# TRANSFORM_SPEC / PDL_SPEC rewrite the program first (IREE's preprocessing specs); an edited
# spec rebuilds the module. EXPECT_IMPORTS fails the build unless the module calls each name.
# A program whose weights are in <stem>_params.irpa beside it (pyree_onnx_import) gets them
# imported into the module, which depends on that archive: an edited archive rebuilds it.
# PREPROCESS runs iree-opt with that pipeline first (files it names: absolute paths, e.g.
# ${CMAKE_CURRENT_SOURCE_DIR}/spec.pdl.mlir; they are tracked through the depfile).
function(pyree_iree_module)
  _pyree_parse(pyree_iree_module "" "NAME;SRC;TARGET;SM;CPU;OUTPUT;TRANSFORM_SPEC;PDL_SPEC;PREPROCESS;VULKAN_TARGET;GFX" "OBJECT_SEARCH_PATHS;DEPENDS;FLAGS;SUBSTITUTE;EXPECT_IMPORTS;LINK_BITCODE" ${ARGN})
  _pyree_require(pyree_iree_module NAME SRC TARGET)
  _pyree_one_of(pyree_iree_module TARGET "${PYREE_BUILD_TARGETS}")
  if(TARGET "${ARG_SRC}")
    # A generated program (pyree_onnx_import): its MLIR, built first.
    _pyree_program("${ARG_SRC}" _src _program_files)
    list(APPEND ARG_DEPENDS "${ARG_SRC}")
  else()
    _pyree_require_files(pyree_iree_module SRC "${ARG_SRC}")
    _pyree_absolute(_src "${ARG_SRC}")
    _pyree_program("${_src}" _src _program_files)
    list(APPEND ARG_DEPENDS ${_program_files})
  endif()
  if(ARG_OUTPUT)
    get_filename_component(_out "${ARG_OUTPUT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}.vmfb")
  endif()
  set(_args --target "${ARG_TARGET}")
  if(ARG_SM)
    list(APPEND _args --sm "${ARG_SM}")
  endif()
  if(ARG_CPU)
    list(APPEND _args --cpu "${ARG_CPU}")
  endif()
  _pyree_gpu_module_args(_args _bitcode_deps)
  _pyree_absolute(_search ${ARG_OBJECT_SEARCH_PATHS})
  set(_file_deps "${_src}" ${_bitcode_deps})
  foreach(_spec_kind TRANSFORM_SPEC PDL_SPEC)
    if(ARG_${_spec_kind})
      _pyree_absolute(_spec "${ARG_${_spec_kind}}")
      string(TOLOWER "${_spec_kind}" _spec_flag)
      string(REPLACE "_" "-" _spec_flag "${_spec_flag}")
      list(APPEND _args "--${_spec_flag}" "${_spec}")
      list(APPEND _file_deps "${_spec}")
    endif()
  endforeach()
  if(ARG_PREPROCESS)
    list(APPEND _args --preprocess "${ARG_PREPROCESS}")
  endif()
  foreach(_import IN LISTS ARG_EXPECT_IMPORTS)
    list(APPEND _args --expect-import "${_import}")
  endforeach()
  set(_target_deps "")
  foreach(_dep IN LISTS ARG_DEPENDS)
    if(TARGET "${_dep}")
      list(APPEND _target_deps "${_dep}")
      get_target_property(_dep_out "${_dep}" PYREE_OUTPUT)
      if(_dep_out)
        list(APPEND _file_deps ${_dep_out})
      endif()
      get_target_property(_dep_dir "${_dep}" PYREE_OBJECT_DIR)
      if(_dep_dir)
        list(APPEND _search "${_dep_dir}")
      endif()
    else()
      _pyree_absolute(_dep_file "${_dep}")
      list(APPEND _file_deps "${_dep_file}")
    endif()
  endforeach()
  foreach(_sub IN LISTS ARG_SUBSTITUTE)
    string(FIND "${_sub}" "=" _eq)
    if(_eq LESS 1)
      message(FATAL_ERROR "pyree_iree_module(${ARG_NAME}): SUBSTITUTE '${_sub}' is not <executable>=<file>")
    endif()
    string(SUBSTRING "${_sub}" 0 ${_eq} _sub_name)
    math(EXPR _file_start "${_eq} + 1")
    string(SUBSTRING "${_sub}" ${_file_start} -1 _sub_file)
    _pyree_absolute(_sub_file "${_sub_file}")
    list(APPEND _args --substitute "${_sub_name}=${_sub_file}")
    list(APPEND _file_deps "${_sub_file}")
  endforeach()
  list(REMOVE_DUPLICATES _search)
  foreach(_dir IN LISTS _search)
    list(APPEND _args --object-search-path "${_dir}")
  endforeach()
  set(_extra "")
  if(ARG_FLAGS)
    set(_extra -- ${ARG_FLAGS})
  endif()
  _pyree_action("${_out}" "${_file_deps}" "iree-compile ${ARG_NAME} (${ARG_TARGET})"
                compile "${_src}" -o "${_out}" ${_args} ${_extra})
  _pyree_artifact_target(${ARG_NAME} "${_out}" "")
  if(_target_deps)
    add_dependencies(${ARG_NAME} ${_target_deps})
  endif()
endfunction()

# pyree_add_run_test(NAME <test> MODULE <target-or-vmfb> FUNCTION <f> [INPUTS <spec>...]
#                    [PLUGINS <target-or-file>...] [DEVICE local-sync|local-task|cuda|vulkan|hip]
#                    [EXPECT <text>...] [CHECK_FILE <file>] [CHECK_PREFIXES <prefix>...]
#                    [EXPECT_CLOSE <values>...] [RTOL <r>] [ATOL <a>]
#                    [LABELS <label>...] [TIMEOUT <seconds>])
# EXPECT: each text appears within one output line (a substring). CHECK_PREFIXES select
# the CHECK_FILE's lines (e.g. CHECK-SYSTEM), as FileCheck's --check-prefix. EXPECT_CLOSE:
# result N equals the Nth values (4xf32=0.1 0.2 ..., or @ref.npy) within RTOL/ATOL.
# A ctest that runs the function and checks its output. Labelled `cpu`, `cuda`, `vulkan` or `hip` by device;
# a test whose device is absent (no GPU) is reported by ctest as skipped, never passed.
function(pyree_add_run_test)
  _pyree_parse(pyree_add_run_test "" "NAME;MODULE;FUNCTION;DEVICE;CHECK_FILE;TIMEOUT;RTOL;ATOL" "INPUTS;PLUGINS;EXPECT;LABELS;CHECK_PREFIXES;EXPECT_CLOSE" ${ARGN})
  _pyree_require(pyree_add_run_test NAME MODULE FUNCTION)
  if(NOT ARG_DEVICE)
    set(ARG_DEVICE local-sync)
  endif()
  _pyree_one_of(pyree_add_run_test DEVICE "${PYREE_BUILD_DEVICES}")
  if(ARG_CHECK_FILE)
    _pyree_require_files(pyree_add_run_test CHECK_FILE "${ARG_CHECK_FILE}")
  endif()
  _pyree_artifact("${ARG_MODULE}" _module)
  set(_args --function "${ARG_FUNCTION}" --device "${ARG_DEVICE}" --skip-unavailable)
  _pyree_timeout(pyree_add_run_test _args)
  _pyree_inputs_and_plugins(_args)
  foreach(_text IN LISTS ARG_EXPECT)
    list(APPEND _args --expect "${_text}")
  endforeach()
  if(ARG_CHECK_FILE)
    _pyree_absolute(_check "${ARG_CHECK_FILE}")
    list(APPEND _args --check-file "${_check}")
  endif()
  foreach(_prefix IN LISTS ARG_CHECK_PREFIXES)
    list(APPEND _args --check-prefix "${_prefix}")
  endforeach()
  foreach(_values IN LISTS ARG_EXPECT_CLOSE)
    list(APPEND _args --expect-close "${_values}")
  endforeach()
  foreach(_tolerance IN ITEMS RTOL ATOL)
    if(DEFINED ARG_${_tolerance})
      if(NOT ARG_${_tolerance} MATCHES "^[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$")
        message(FATAL_ERROR "pyree_add_run_test: ${_tolerance} '${ARG_${_tolerance}}' is not a non-negative number")
      endif()
      string(TOLOWER "${_tolerance}" _flag)
      list(APPEND _args --${_flag} "${ARG_${_tolerance}}")
    endif()
  endforeach()
  add_test(NAME ${ARG_NAME} COMMAND ${PYREE_BUILD_COMMAND} run "${_module}" ${_args}
           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  # Labelled by the device's driver (cuda, vulkan, hip, ...); the host CPU's devices as cpu.
  string(REGEX REPLACE ":.*$" "" _labels "${ARG_DEVICE}")
  if(_labels MATCHES "^local-")
    set(_labels cpu)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${_labels};${ARG_LABELS}"
    SKIP_RETURN_CODE ${PYREE_BUILD_SKIP_CODE})
endfunction()

# pyree_add_benchmark(NAME <test> MODULE <target-or-vmfb> [FUNCTION <f>] [INPUTS <spec>...]
#                     [PLUGINS <target-or-file>...] [DEVICE <device>] [COMPARE <target-or-vmfb>]
#                     [REPETITIONS <n>] [TIMEOUT <seconds>])
# A microbenchmark as a ctest outside the default run: it belongs to the ctest configuration
# `benchmark` and carries the label `benchmark`, so plain `ctest` skips it and
# `ctest -C benchmark -L benchmark -V` runs it. With COMPARE it prints the ratio COMPARE/MODULE.
# Without FUNCTION every function is timed (a dumped _benchmark.mlir has one per dispatch).
# A cuda benchmark where no GPU is usable is reported as skipped.
function(pyree_add_benchmark)
  _pyree_parse(pyree_add_benchmark "" "NAME;MODULE;FUNCTION;DEVICE;COMPARE;REPETITIONS;TIMEOUT" "INPUTS;PLUGINS" ${ARGN})
  _pyree_require(pyree_add_benchmark NAME MODULE)
  _pyree_one_of(pyree_add_benchmark DEVICE "${PYREE_BUILD_DEVICES}")
  _pyree_artifact("${ARG_MODULE}" _module)
  set(_args "")
  if(ARG_COMPARE)
    _pyree_artifact("${ARG_COMPARE}" _other)
    set(_args --compare "${_module}" "${_other}")
  else()
    set(_args "${_module}")
  endif()
  if(ARG_FUNCTION)
    list(APPEND _args --function "${ARG_FUNCTION}")
  endif()
  if(ARG_DEVICE)
    list(APPEND _args --device "${ARG_DEVICE}")
  endif()
  if(ARG_REPETITIONS)
    list(APPEND _args --repetitions "${ARG_REPETITIONS}")
  endif()
  _pyree_inputs_and_plugins(_args)
  _pyree_timeout(pyree_add_benchmark _args)
  list(APPEND _args --skip-unavailable)
  add_test(NAME ${ARG_NAME} COMMAND ${PYREE_BUILD_COMMAND} bench ${_args} CONFIGURATIONS benchmark
           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS benchmark SKIP_RETURN_CODE ${PYREE_BUILD_SKIP_CODE})
endfunction()

# pyree_onnx_import(NAME <name> SRC <model.onnx> [OUTPUT_DIR <dir>] [OPSET_VERSION <n>]
#                   [DATA_DIR <dir>] [INLINE_PARAMS])
# Imports an ONNX model to <name>.mlir in ${CMAKE_CURRENT_BINARY_DIR} (or OUTPUT_DIR, relative
# to the binary dir) with `pyree-build import` (needs pip install "pyree_build[onnx]"): every
# op named by its ONNX node, checked by IREE's input conversion. The target <name> is a valid
# SRC of pyree_iree_module. Large weights go to <name>_params.irpa beside it (always written,
# empty where no weight is large), which the module's compile imports back and depends on;
# INLINE_PARAMS keeps them in the MLIR instead (EXTERNALIZE_PARAMS, the default, is accepted).
function(pyree_onnx_import)
  _pyree_parse(pyree_onnx_import "EXTERNALIZE_PARAMS;INLINE_PARAMS" "NAME;SRC;OUTPUT_DIR;OPSET_VERSION;DATA_DIR" "" ${ARGN})
  _pyree_require(pyree_onnx_import NAME SRC)
  _pyree_require_files(pyree_onnx_import SRC "${ARG_SRC}")
  _pyree_absolute(_src "${ARG_SRC}")
  if(ARG_OUTPUT_DIR)
    get_filename_component(_dir "${ARG_OUTPUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(_dir "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  set(_outs "${_dir}/${ARG_NAME}.mlir")
  set(_args "")
  if(DEFINED ARG_OPSET_VERSION)
    if(NOT ARG_OPSET_VERSION MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "pyree_onnx_import(${ARG_NAME}): OPSET_VERSION '${ARG_OPSET_VERSION}' is not an opset number (e.g. 17)")
    endif()
    list(APPEND _args --opset-version "${ARG_OPSET_VERSION}")
  endif()
  if(ARG_DATA_DIR)
    _pyree_absolute(_data "${ARG_DATA_DIR}")
    if(NOT IS_DIRECTORY "${_data}")
      message(FATAL_ERROR "pyree_onnx_import(${ARG_NAME}): DATA_DIR '${ARG_DATA_DIR}' is not a directory (looked for ${_data})")
    endif()
    list(APPEND _args --data-dir "${_data}")
  endif()
  if(ARG_INLINE_PARAMS AND ARG_EXTERNALIZE_PARAMS)
    message(FATAL_ERROR "pyree_onnx_import(${ARG_NAME}): INLINE_PARAMS and EXTERNALIZE_PARAMS contradict each other; pass one")
  elseif(ARG_INLINE_PARAMS)
    list(APPEND _args --inline-params)
  else()
    list(APPEND _outs "${_dir}/${ARG_NAME}_params.irpa")
  endif()
  _pyree_action("${_outs}" "${_src}" "import ${ARG_NAME} (ONNX)" import "${_src}" -o "${_dir}/${ARG_NAME}.mlir" ${_args})
  _pyree_artifact_target(${ARG_NAME} "${_outs}" "")
endfunction()

# pyree_add_verify_test(NAME <test> MODULE <target-or-vmfb> ONNX <model.onnx> [FUNCTION <f>]
#                       [PLUGINS <target-or-file>...] [INPUTS <spec>...] [INPUT_FILES <dir-or-file>...]
#                       [BASELINE <target-or-vmfb>] [SEED <s>] [TRIALS <n>] [RTOL <r>]
#                       [ATOL <a>] [DEVICE <device>] [LABELS <label>...])
# A ctest that runs `pyree-build verify`: the module and the ONNX model (onnxruntime) on the
# same inputs (TRIALS seeded draws from SEED, or INPUTS specs, or INPUT_FILES: an ONNX test
# directory whose stored outputs are the reference, or .pb/.npy files), every output within
# RTOL/ATOL, else it fails and prints the worst element of each output. BASELINE: the model
# compiled without the replacement, so an output IREE itself gets wrong is reported as IREE's.
# Labelled like pyree_add_run_test, plus onnx. A DEVICE absent here is reported skipped (exit 77).
function(pyree_add_verify_test)
  _pyree_parse(pyree_add_verify_test "" "NAME;MODULE;ONNX;FUNCTION;SEED;TRIALS;RTOL;ATOL;DEVICE;BASELINE" "PLUGINS;INPUTS;INPUT_FILES;LABELS" ${ARGN})
  _pyree_require(pyree_add_verify_test NAME MODULE ONNX)
  if(NOT ARG_DEVICE)
    set(ARG_DEVICE local-sync)
  endif()
  _pyree_one_of(pyree_add_verify_test DEVICE "${PYREE_BUILD_DEVICES}")
  _pyree_require_files(pyree_add_verify_test ONNX "${ARG_ONNX}")
  _pyree_absolute(_onnx "${ARG_ONNX}")
  _pyree_artifact("${ARG_MODULE}" _module)
  set(_args --onnx "${_onnx}" --device "${ARG_DEVICE}")
  if(ARG_FUNCTION)
    list(APPEND _args --function "${ARG_FUNCTION}")
  endif()
  if(DEFINED ARG_SEED)
    if(NOT ARG_SEED MATCHES "^[0-9]+$")
      message(FATAL_ERROR "pyree_add_verify_test: SEED '${ARG_SEED}' is not a non-negative whole number")
    endif()
    list(APPEND _args --seed "${ARG_SEED}")
  endif()
  if(DEFINED ARG_TRIALS)
    if(NOT ARG_TRIALS MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "pyree_add_verify_test: TRIALS '${ARG_TRIALS}' is not a positive whole number")
    endif()
    list(APPEND _args --trials "${ARG_TRIALS}")
  endif()
  foreach(_tolerance IN ITEMS RTOL ATOL)
    if(DEFINED ARG_${_tolerance})
      if(NOT ARG_${_tolerance} MATCHES "^[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$")
        message(FATAL_ERROR "pyree_add_verify_test: ${_tolerance} '${ARG_${_tolerance}}' is not a non-negative number")
      endif()
      string(TOLOWER "${_tolerance}" _flag)
      list(APPEND _args --${_flag} "${ARG_${_tolerance}}")
    endif()
  endforeach()
  if(ARG_BASELINE)
    _pyree_artifact("${ARG_BASELINE}" _baseline)
    list(APPEND _args --baseline "${_baseline}")
  endif()
  if(ARG_INPUT_FILES)
    foreach(_stored IN LISTS ARG_INPUT_FILES)
      _pyree_absolute(_stored_path "${_stored}")
      if(NOT EXISTS "${_stored_path}")
        message(FATAL_ERROR "pyree_add_verify_test: INPUT_FILES '${_stored}' not found (looked for ${_stored_path})")
      endif()
      list(APPEND _stored_paths "${_stored_path}")
    endforeach()
    list(APPEND _args --inputs ${_stored_paths})
  endif()
  _pyree_inputs_and_plugins(_args)
  # A GPU device that is absent (no GPU here) skips the test with the reason, never passes it.
  list(APPEND _args --skip-unavailable)
  add_test(NAME ${ARG_NAME} COMMAND ${PYREE_BUILD_COMMAND} verify "${_module}" ${_args}
           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  string(REGEX REPLACE ":.*$" "" _labels "${ARG_DEVICE}")
  if(_labels MATCHES "^local-")
    set(_labels cpu)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${_labels};onnx;${ARG_LABELS}" SKIP_RETURN_CODE ${PYREE_BUILD_SKIP_CODE})
endfunction()

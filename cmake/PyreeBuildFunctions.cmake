# The pyree_* functions. Each one declares which files go in, which come out and which
# `pyree-build` verb makes them; it holds no compiler flags (those live in Python, so the
# CLI, the Python API and CMake produce identical outputs). Every action writes a depfile
# listing the sources, included headers, tools and pyree_build itself, so Ninja rebuilds
# an output when any of them changes and not otherwise.
include_guard(GLOBAL)

if(POLICY CMP0116)
  cmake_policy(SET CMP0116 NEW)  # depfiles hold absolute paths
endif()

set(PYREE_BUILD_COMMAND "${PYREE_BUILD_PYTHON}" -m pyree_build)
# Exit code `pyree-build run --skip-unavailable` uses when the device (a GPU) is absent.
set(PYREE_BUILD_SKIP_CODE 77)

# Every artifact joins iree-sample-deps, as in IREE's own build.
function(_pyree_register target)
  if(NOT TARGET iree-sample-deps)
    add_custom_target(iree-sample-deps COMMENT "Building IREE sample data targets")
  endif()
  add_dependencies(iree-sample-deps ${target})
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

# A pyree_* target name resolves to its output file; anything else is a path.
function(_pyree_artifact item out_var)
  if(TARGET "${item}")
    get_target_property(_out "${item}" PYREE_OUTPUT)
    if(NOT _out)
      message(FATAL_ERROR "target '${item}' is not a pyree_* artifact (it has no PYREE_OUTPUT)")
    endif()
    set(${out_var} "${_out}" PARENT_SCOPE)
  else()
    get_filename_component(_abs "${item}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    set(${out_var} "${_abs}" PARENT_SCOPE)
  endif()
endfunction()

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

# A shared remote cache behind the local one (README: "Sharing the cache between machines").
# Empty: the environment's PYREE_BUILD_REMOTE_CACHE applies, if any. Credentials belong in the
# environment (PYREE_BUILD_REMOTE_CACHE_TOKEN / _AUTH), never here: this ends up in build.ninja.
set(PYREE_BUILD_REMOTE_CACHE "" CACHE STRING "http(s)://host/path of a shared pyree_build cache (HTTP GET/PUT)")
set(PYREE_BUILD_REMOTE_CACHE_MODE "" CACHE STRING "read: use the remote cache's hits, upload nothing")

# Runs `pyree-build <verb> <ARGN>` to make `outputs` (a list) from `depends`, with a depfile
# beside the first output so Ninja also tracks the headers, tools and pyree_build itself.
function(_pyree_action outputs depends comment verb)
  list(GET outputs 0 _first)
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

# One `pyree-build <verb>` per source in SRCS, each making one output per variant (arch or
# sm) in ${CMAKE_CURRENT_BINARY_DIR}/<name>/: `pattern` names them, with <stem> and <v>
# replaced. Creates the target <name>; its directory is an object search path.
function(_pyree_fan_out name verb label srcs variant_flag variants pattern)
  set(_dir "${CMAKE_CURRENT_BINARY_DIR}/${name}")
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
#                  [CPU baseline|host])
# SYSTEM: a shared library for this host (<name>.so); CPU host builds for this CPU only. STANDALONE: freestanding ELFs, one per
# arch, linked by iree-lld and packed into a FatELF (<name>.sos; <name>.so for one arch).
function(pyree_cpu_plugin)
  cmake_parse_arguments(ARG "SYSTEM;STANDALONE" "NAME;OUTPUT;CC;CPU" "SRCS;ARCHS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_cpu_plugin NAME SRCS)
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
  _pyree_action("${_out}" "${_srcs}" "${_kind} plugin ${ARG_NAME}" plugin --kind ${_kind} ${_flags} ${_srcs} -o "${_out}")
  _pyree_artifact_target(${ARG_NAME} "${_out}" "")
endfunction()

# pyree_cpu_objects(NAME <name> SRCS <c>... ARCHS <arch>... [CC ...] [INCLUDE_DIRS ...]
#                   [DEFINES ...] [ALLOW_UNDEFINED <symbol>...])
# One freestanding object per source and arch in ${CMAKE_CURRENT_BINARY_DIR}/<name>/,
# named <stem>_<arch>.o; a module that DEPENDS on <name> finds them by search path.
function(pyree_cpu_objects)
  cmake_parse_arguments(ARG "" "NAME;CC" "SRCS;ARCHS;INCLUDE_DIRS;DEFINES;ALLOW_UNDEFINED" ${ARGN})
  _pyree_require(pyree_cpu_objects NAME SRCS ARCHS)
  _pyree_absolute(_srcs ${ARG_SRCS})
  _pyree_c_flags(_flags)
  foreach(_sym IN LISTS ARG_ALLOW_UNDEFINED)
    list(APPEND _flags --allow-undefined "${_sym}")
  endforeach()
  _pyree_fan_out(${ARG_NAME} objects objects "${_srcs}" --arch "${ARG_ARCHS}" "<stem>_<v>.o" ${_flags})
endfunction()

# pyree_cuda_ptx(NAME <name> SRCS <cu>... SMS <sm>... [COMPILER nvrtc|nvcc] [VERIFY]
#                [PTX_ISA auto|native|<major.minor>] [INCLUDE_DIRS ...] [DEFINES ...])
# One PTX per source and sm in ${CMAKE_CURRENT_BINARY_DIR}/<name>/<stem>_sm_<N>.ptx.
function(pyree_cuda_ptx)
  cmake_parse_arguments(ARG "VERIFY" "NAME;COMPILER;PTX_ISA" "SRCS;SMS;INCLUDE_DIRS;DEFINES" ${ARGN})
  _pyree_require(pyree_cuda_ptx NAME SRCS SMS)
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

# pyree_iree_module(NAME <name> SRC <mlir> TARGET llvm-cpu|cuda [SM <sm>] [CPU generic|host]
#                   [OBJECT_SEARCH_PATHS <dir>...] [DEPENDS <target-or-file>...]
#                   [SUBSTITUTE <executable>=<file>...] [FLAGS <iree-compile flag>...] [OUTPUT <file>])
# Compiles to <name>.vmfb. A DEPENDS entry that is a pyree_cuda_ptx or pyree_cpu_objects
# target also adds its output directory to the object search paths. SUBSTITUTE replaces an
# executable by a file (relative to this directory): .mlir as source, anything else as object.
function(pyree_iree_module)
  cmake_parse_arguments(ARG "" "NAME;SRC;TARGET;SM;CPU;OUTPUT" "OBJECT_SEARCH_PATHS;DEPENDS;FLAGS;SUBSTITUTE" ${ARGN})
  _pyree_require(pyree_iree_module NAME SRC TARGET)
  _pyree_absolute(_src "${ARG_SRC}")
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
  _pyree_absolute(_search ${ARG_OBJECT_SEARCH_PATHS})
  set(_file_deps "${_src}")
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
#                    [PLUGINS <target-or-file>...] [DEVICE local-sync|local-task|cuda]
#                    [EXPECT <text>...] [CHECK_FILE <file>] [LABELS <label>...])
# A ctest that runs the function and checks its output. Labelled `cpu` or `cuda` by device;
# a test whose device is absent (no GPU) is reported by ctest as skipped, never passed.
function(pyree_add_run_test)
  cmake_parse_arguments(ARG "" "NAME;MODULE;FUNCTION;DEVICE;CHECK_FILE" "INPUTS;PLUGINS;EXPECT;LABELS" ${ARGN})
  _pyree_require(pyree_add_run_test NAME MODULE FUNCTION)
  if(NOT ARG_DEVICE)
    set(ARG_DEVICE local-sync)
  endif()
  _pyree_artifact("${ARG_MODULE}" _module)
  set(_args --function "${ARG_FUNCTION}" --device "${ARG_DEVICE}" --skip-unavailable)
  _pyree_inputs_and_plugins(_args)
  foreach(_text IN LISTS ARG_EXPECT)
    list(APPEND _args --expect "${_text}")
  endforeach()
  if(ARG_CHECK_FILE)
    _pyree_absolute(_check "${ARG_CHECK_FILE}")
    list(APPEND _args --check-file "${_check}")
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${PYREE_BUILD_COMMAND} run "${_module}" ${_args}
           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  if(ARG_DEVICE STREQUAL "cuda")
    set(_labels cuda)
  else()
    set(_labels cpu)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${_labels};${ARG_LABELS}"
    SKIP_RETURN_CODE ${PYREE_BUILD_SKIP_CODE})
endfunction()

# pyree_add_benchmark(NAME <test> MODULE <target-or-vmfb> [FUNCTION <f>] [INPUTS <spec>...]
#                     [PLUGINS <target-or-file>...] [DEVICE <device>] [COMPARE <target-or-vmfb>]
#                     [REPETITIONS <n>])
# A microbenchmark as a ctest outside the default run: it belongs to the ctest configuration
# `benchmark` and carries the label `benchmark`, so plain `ctest` skips it and
# `ctest -C benchmark -L benchmark -V` runs it. With COMPARE it prints the ratio COMPARE/MODULE.
# Without FUNCTION every function is timed (a dumped _benchmark.mlir has one per dispatch).
# A cuda benchmark where no GPU is usable is reported as skipped.
function(pyree_add_benchmark)
  cmake_parse_arguments(ARG "" "NAME;MODULE;FUNCTION;DEVICE;COMPARE;REPETITIONS" "INPUTS;PLUGINS" ${ARGN})
  _pyree_require(pyree_add_benchmark NAME MODULE)
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
  list(APPEND _args --skip-unavailable)
  add_test(NAME ${ARG_NAME} COMMAND ${PYREE_BUILD_COMMAND} bench ${_args} CONFIGURATIONS benchmark
           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS benchmark SKIP_RETURN_CODE ${PYREE_BUILD_SKIP_CODE})
endfunction()

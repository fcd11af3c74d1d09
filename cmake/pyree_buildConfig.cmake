# pyree_build CMake package: find_package(pyree_build CONFIG REQUIRED).
#
# Provides the pyree_* functions (PyreeBuildFunctions.cmake beside this file). They only
# declare outputs and dependencies; every action runs `python -m pyree_build <verb>` with
# the Python that has pyree_build installed, recorded here as PYREE_BUILD_PYTHON.
include_guard(GLOBAL)

set(PYREE_BUILD_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(_pyree_package_dir "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

function(_pyree_python_works candidate out_var)
  set(${out_var} FALSE PARENT_SCOPE)
  if(NOT candidate OR NOT EXISTS "${candidate}")
    return()
  endif()
  # Python puts the current directory first on sys.path for -c and -m: run from this
  # package's own cmake directory (no pyree_build/ in it), never from wherever cmake was
  # started (a checkout's root would shadow the installed package).
  execute_process(
    COMMAND "${candidate}" -c "import pyree_build, sys; sys.stdout.write(pyree_build.__version__)"
    WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _version ERROR_QUIET)
  if(_rc EQUAL 0 AND (NOT PACKAGE_VERSION OR _version VERSION_EQUAL PACKAGE_VERSION))
    set(${out_var} TRUE PARENT_SCOPE)
  endif()
endfunction()

if(NOT PYREE_BUILD_PYTHON)
  # Candidates, most specific first: an explicit choice, the Python a scikit-build-core
  # build runs with, the interpreter of the environment this package is installed in
  # (<prefix>/lib/pythonX.Y/site-packages/pyree_build -> <prefix>/bin), then PATH.
  set(_pyree_candidates "$ENV{PYREE_BUILD_PYTHON}" "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}")
  get_filename_component(_pyree_prefix "${_pyree_package_dir}/../../../.." ABSOLUTE)
  foreach(_name python3 python)
    list(APPEND _pyree_candidates "${_pyree_prefix}/bin/${_name}")
  endforeach()
  find_program(_pyree_path_python NAMES python3 python)
  list(APPEND _pyree_candidates "${_pyree_path_python}")
  foreach(_candidate IN LISTS _pyree_candidates)
    _pyree_python_works("${_candidate}" _ok)
    if(_ok)
      set(PYREE_BUILD_PYTHON "${_candidate}" CACHE FILEPATH "Python interpreter with pyree_build installed")
      break()
    endif()
  endforeach()
endif()

if(NOT PYREE_BUILD_PYTHON)
  set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
  set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE
    "no Python interpreter that can `import pyree_build` ${PACKAGE_VERSION} was found. Configure with -DPYREE_BUILD_PYTHON=/path/to/python (the one you ran `pip install` with).")
  return()
endif()

include("${CMAKE_CURRENT_LIST_DIR}/PyreeBuildFunctions.cmake")

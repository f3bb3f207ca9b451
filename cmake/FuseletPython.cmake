# Helpers to ask the build Python about the frameworks it imports, and to record what an
# extension was compiled against (the provenance the import-time ABI guard compares).
find_package(Python 3.9 COMPONENTS Interpreter)

# fuselet_python_json(<out-var> <code>): runs <code> in the build Python; <code> must print
# one JSON document. Fails the configure step with the Python error on failure.
function(fuselet_python_json out code)
  if(NOT Python_EXECUTABLE)
    message(FATAL_ERROR "fuselet: no Python interpreter found (set Python_EXECUTABLE); needed for:\n${code}")
  endif()
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${code}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuselet: ${Python_EXECUTABLE} could not run:\n${code}\n${err}")
  endif()
  set(${out} "${json}" PARENT_SCOPE)
endfunction()

# fuselet_python_site(<out-var>): site-packages of the build Python, relative to its prefix
# (lib/python3.11/site-packages), or "" when there is no Python (a core-only build).
function(fuselet_python_site out)
  set(${out} "" PARENT_SCOPE)
  if(Python_EXECUTABLE)
    fuselet_python_json(prefix "import sys; print(sys.prefix)")
    fuselet_python_json(site "import sysconfig; print(sysconfig.get_path('platlib'))")
    file(RELATIVE_PATH rel "${prefix}" "${site}")
    set(${out} "${rel}" PARENT_SCOPE)
  endif()
endfunction()

# fuselet_build_info(<target> <install-dir> <component> <json>): writes <json> (a JSON object,
# extended here with the compiler and CUDA facts) as _build_info.json next to the extension.
function(fuselet_build_info target dest component json)
  string(JSON json SET "${json}" fuselet_version "\"${PROJECT_VERSION}\"")
  string(JSON json SET "${json}" compiler "\"${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}\"")
  if(FUSELET_CUDA)
    string(JSON json SET "${json}" cuda_toolkit "\"${CUDAToolkit_VERSION}\"")
    string(JSON json SET "${json}" cuda_archs "\"${FUSELET_CUDA_ARCHS}\"")
  else()
    string(JSON json SET "${json}" cuda_toolkit null)
    string(JSON json SET "${json}" cuda_archs null)
  endif()
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${target}_build_info.json")
  file(WRITE "${out}" "${json}\n")
  install(FILES "${out}" DESTINATION "${dest}" RENAME _build_info.json COMPONENT ${component})
endfunction()

# fuselet_select_frameworks(): FUSELET_FRAMEWORK -> FUSELET_TORCH / FUSELET_JAX (ON/OFF).
# "auto" builds each extension whose framework the build python can import.
function(fuselet_select_frameworks)
  set(fw "${FUSELET_FRAMEWORK}")
  if(NOT fw MATCHES "^(auto|torch|jax|all|none)$")
    message(FATAL_ERROR "fuselet: FUSELET_FRAMEWORK must be one of auto, torch, jax, all, none; got '${fw}'")
  endif()
  set(torch OFF)
  set(jax OFF)
  if(fw STREQUAL "auto")
    fuselet_python_json(found [=[
import importlib.util, json
print(json.dumps([m for m in ("torch", "jax") if importlib.util.find_spec(m) is not None]))
]=])
    string(FIND "${found}" "\"torch\"" has_torch)
    string(FIND "${found}" "\"jax\"" has_jax)
    if(NOT has_torch EQUAL -1)
      set(torch ON)
    endif()
    if(NOT has_jax EQUAL -1)
      set(jax ON)
    endif()
    message(STATUS "fuselet: FUSELET_FRAMEWORK=auto found ${found} in ${Python_EXECUTABLE}")
  endif()
  if(fw STREQUAL "torch" OR fw STREQUAL "all")
    set(torch ON)
  endif()
  if(fw STREQUAL "jax" OR fw STREQUAL "all")
    set(jax ON)
  endif()
  set(FUSELET_TORCH ${torch} PARENT_SCOPE)
  set(FUSELET_JAX ${jax} PARENT_SCOPE)
endfunction()

# fuselet_dist_info(<component> <distribution>): in a prefix install (conda), the Python package
# gets a <distribution>-<version>.dist-info in site-packages, so pip (pip check, pip list) and
# importlib.metadata see it as they see a pip-installed fuselet. The wheel (FUSELET_PYTHON=ON)
# gets its metadata from scikit-build-core. The framework libraries of a prefix install hold no
# Python, and so no dist-info: conda's own pins tie them to their framework.
function(fuselet_dist_info component dist)
  if(FUSELET_PYTHON OR NOT FUSELET_PYTHON_SITE)
    return()
  endif()
  string(REPLACE "-" "_" stem "${dist}")
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/dist-info/${stem}-${PROJECT_VERSION}.dist-info")
  set(meta "Metadata-Version: 2.1\nName: ${dist}\nVersion: ${PROJECT_VERSION}\n")
  string(APPEND meta "Summary: ${PROJECT_DESCRIPTION}\nLicense: Apache-2.0\nRequires-Python: >=3.10\n")
  file(WRITE "${dir}/METADATA" "${meta}")
  file(WRITE "${dir}/INSTALLER" "conda\n")
  install(DIRECTORY "${dir}" DESTINATION "${FUSELET_PYTHON_SITE}" COMPONENT ${component})
endfunction()

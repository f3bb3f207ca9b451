# ctest -P: runs one emulated CUDA test (TEST) once per thread order of ORDERS (comma-separated
# FUSELET_EMU_ORDER values, csrc/emu, each with an optional @N: the grid capped at N blocks,
# FUSELET_EMU_MAX_GRID, so that the rows are grid-strided) and passes only when every run
# passes, no run reports an emulator error, and every run copies the same bytes to the host (FUSELET_EMU_DIGEST): a result
# that depends on the order the threads of a block run in (a missing __syncthreads) is a failure
# even where each order alone stays within the test's tolerance.
#   cmake -DTEST=<executable> [-DTEST_ARG=<its argument>] -DORDERS=forward,random:7@5 -DWORK=<folder> -P orders.cmake
# One order alone (the sanitizers' runs) checks the run and the emulator's reports only.
string(REPLACE "," ";" _orders "${ORDERS}")
list(LENGTH _orders _n)
if(_n LESS 1)
  message(FATAL_ERROR "orders.cmake: ORDERS must name the thread orders, got '${ORDERS}'")
endif()
file(MAKE_DIRECTORY "${WORK}")
set(_first_digest "")
set(_first_order "")
foreach(_item ${_orders})
  # ORDER[@GRID]: the thread order, and a lower grid cap (FUSELET_EMU_MAX_GRID) for that run
  string(REPLACE "@" ";" _parts "${_item}")
  list(GET _parts 0 _thread_order)
  set(_grid "")
  list(LENGTH _parts _nparts)
  if(_nparts GREATER 1)
    list(GET _parts 1 _grid)
  endif()
  set(_order "${_item}")  # as messages name it
  string(REGEX REPLACE "[:@]" "-" _tag "${_item}")
  set(_digest_file "${WORK}/digest-${_tag}.txt")
  file(REMOVE "${_digest_file}")
  string(TIMESTAMP _t0 "%s")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "FUSELET_EMU_ORDER=${_thread_order}" "FUSELET_EMU_MAX_GRID=${_grid}"
                          "FUSELET_EMU_DIGEST=${_digest_file}"
                          "${TEST}" ${TEST_ARG}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  string(TIMESTAMP _t1 "%s")
  math(EXPR _secs "${_t1} - ${_t0}")
  string(REGEX MATCH "[0-9]+ passed, [0-9]+ failed[^\n]*" _summary "${_out}")
  message(STATUS "${_order}: ${_summary} (exit ${_rc}, ${_secs} s)")
  if(NOT _rc EQUAL 0 OR _err MATCHES "fuselet-emu: error")
    message("${_out}")
    message("${_err}")
    message(FATAL_ERROR "${TEST} failed in thread order ${_order} (exit ${_rc})")
  endif()
  if(NOT EXISTS "${_digest_file}")
    message(FATAL_ERROR "${TEST} wrote no digest in thread order ${_order}: is it linked to libfuselet_cuda_emu?")
  endif()
  file(READ "${_digest_file}" _digest)
  string(STRIP "${_digest}" _digest)
  message(STATUS "${_order}: digest ${_digest}")
  if(_first_order STREQUAL "")
    set(_first_digest "${_digest}")
    set(_first_order "${_order}")
  elseif(NOT _digest STREQUAL _first_digest)
    message(STATUS "orders differ: ${_first_order} ${_order}")
    message(FATAL_ERROR "${TEST}: the outputs differ between thread orders ${_first_order} (${_first_digest}) and "
                        "${_order} (${_digest}): a result depends on the order the threads run in "
                        "(a missing __syncthreads, or a read of another thread's write that no barrier orders)")
  endif()
endforeach()

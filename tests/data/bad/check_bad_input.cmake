# Runs the `pagedkv` CLI on one bad input and checks the error contract (DESIGN.md "Error
# policy", issue 8): exit code EXPECTED (2), exactly one line on stderr matching REGEX (or, with
# LAST_LINE, a last line matching it after per-row notes), no sanitizer report, no output file
# left behind (with EXPECTED 0, a positive control: the output file must exist), and no huge allocation (the run gets a memory cap).
#   cmake -DEXE=path -DARGS=a;b;c [-DEXPECTED=2] [-DREGEX=re] [-DLAST_LINE=ON] [-DOUT_FILE=path]
#         [-DSTDOUT_EMPTY=ON] [-DSANITIZED=ON] [-DMEMORY_LIMIT_MB=1024] [-DINPUT=path]
#         -P check_bad_input.cmake
# INPUT: a file (or device: /dev/zero) fed to the command's stdin.
if(NOT DEFINED EXPECTED)
  set(EXPECTED 2)
endif()
if(NOT DEFINED MEMORY_LIMIT_MB)
  set(MEMORY_LIMIT_MB 1024)
endif()
if(DEFINED OUT_FILE)
  file(REMOVE ${OUT_FILE})
endif()

if(SANITIZED)
  # ASan reserves terabytes of address space, so `ulimit -v` cannot cap it; ASan's own limit
  # turns any single allocation above the cap into a report (and a failed test) instead.
  set(ENV{ASAN_OPTIONS}
      "$ENV{ASAN_OPTIONS}:max_allocation_size_mb=${MEMORY_LIMIT_MB}:allocator_may_return_null=0")
  set(_cmd ${EXE} ${ARGS})
else()
  # A corrupt header must be rejected before anything large is allocated: under the cap a huge
  # allocation fails (exit 1, "out of memory") instead of passing unnoticed.
  math(EXPR _kb "${MEMORY_LIMIT_MB} * 1024")
  set(_cmd sh -c "ulimit -v ${_kb} && exec \"$0\" \"$@\"" ${EXE} ${ARGS})
endif()
# CLI options stay deterministic and quiet: no progress bars, single-threaded kernels.
set(ENV{OMP_NUM_THREADS} 1)
set(_input)
if(DEFINED INPUT)
  set(_input INPUT_FILE ${INPUT})
endif()
execute_process(COMMAND ${_cmd} ${_input} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 120)
set(_ctx "command: ${EXE} ${ARGS}\nexit code: ${rc}\nstdout:\n${out}\nstderr:\n${err}")

if(NOT rc STREQUAL EXPECTED)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECTED}\n${_ctx}")
endif()
if(err MATCHES "Sanitizer|runtime error:")
  message(FATAL_ERROR "sanitizer report\n${_ctx}")
endif()
if(DEFINED REGEX)
  if(LAST_LINE)
    string(REGEX MATCH "[^\n]*\n$" _line "${err}")
  else()
    # Exactly one line: the whole of stderr is one newline-terminated line.
    if(NOT err MATCHES "^[^\n]*\n$")
      message(FATAL_ERROR "stderr is not exactly one line\n${_ctx}")
    endif()
    set(_line "${err}")
  endif()
  if(NOT _line MATCHES "${REGEX}")
    message(FATAL_ERROR "error line does not match '${REGEX}'\n${_ctx}")
  endif()
endif()
if(STDOUT_EMPTY AND NOT out STREQUAL "")
  message(FATAL_ERROR "partial output on stdout\n${_ctx}")
endif()
if(DEFINED OUT_FILE)
  if(EXPECTED STREQUAL "0" AND NOT EXISTS ${OUT_FILE})
    message(FATAL_ERROR "output file missing after a successful run: ${OUT_FILE}\n${_ctx}")
  elseif(NOT EXPECTED STREQUAL "0" AND EXISTS ${OUT_FILE})
    message(FATAL_ERROR "partial output file left behind: ${OUT_FILE}\n${_ctx}")
  endif()
endif()
message(STATUS "ok: exit ${rc}; stderr: ${err}")

# Runs a sanitizer canary and requires a non-zero exit and the expected report on stderr.
#   cmake -DEXE=path -DREPORT=regex -P check.cmake
execute_process(COMMAND ${EXE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "${REPORT}")
  message(FATAL_ERROR "the sanitizer did not fire (exit ${rc}); expected '${REPORT}'\n"
                      "ASAN_OPTIONS=$ENV{ASAN_OPTIONS}\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "sanitizer fired as expected (exit ${rc})")

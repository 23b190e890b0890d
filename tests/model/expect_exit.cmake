# Runs EXE with ARGS (a ;-list) and checks its exit code and stderr: the CLI's error contract.
#   -DEXE=path -DARGS=a|b|c -DEXPECTED=2 [-DSTDERR_REGEX=re] [-DBAD_FILE=path -DBAD_CONTENT=text]
# ARGS are separated by '|' (a ';' list does not survive add_test -> cmake -D intact).
# BAD_FILE is written first (a corrupt input made on the spot, so the test needs no fixture).
string(REPLACE "|" ";" ARGS "${ARGS}")
if(DEFINED BAD_FILE)
  get_filename_component(_dir ${BAD_FILE} DIRECTORY)
  file(MAKE_DIRECTORY ${_dir})
  file(WRITE ${BAD_FILE} "${BAD_CONTENT}")
endif()
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL EXPECTED)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECTED}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${STDERR_REGEX}':\n${err}")
endif()
message(STATUS "exit ${rc} as expected; stderr: ${err}")

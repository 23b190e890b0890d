# Runs EXE with ARGS and checks its exit code and stderr: the CLI's error contract.
#   -DEXE=path "-DARGS=a\;b\;c" -DEXPECTED=2 [-DSTDERR_REGEX=re] [-DBAD_FILE=path -DBAD_CONTENT=text]
# add_test keeps the escaped "\;" literally, so ARGS arrives as one string; it is split here.
# BAD_FILE is written first (an input made on the spot, so the test needs no fixture).
if(DEFINED BAD_FILE)
  get_filename_component(_dir ${BAD_FILE} DIRECTORY)
  file(MAKE_DIRECTORY ${_dir})
  string(REPLACE "\\n" "\n" _content "${BAD_CONTENT}")
  file(WRITE ${BAD_FILE} "${_content}")
endif()
string(REPLACE "\\;" ";" _args "${ARGS}")
execute_process(COMMAND ${EXE} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL EXPECTED)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECTED}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${STDERR_REGEX}':\n${err}")
endif()
message(STATUS "exit ${rc} as expected; stderr: ${err}")

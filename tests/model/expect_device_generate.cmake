# `pagedkv generate --device cuda` on whatever machine runs the tests: the one test that is right
# both where a GPU is and where none is, decided up front rather than from the run's own answer
# (a run that wrongly reports "no CUDA device" on a GPU machine must fail).
#   -DEXE=path -DWITH_CUDA=ON|OFF -DARGS=a|b|c   (ARGS '|'-separated, as in expect_exit.cmake)
# A GPU is expected when this is a CUDA build and `nvidia-smi -L` lists one. Then: exit 0 and the
# device run agreeing with the CPU caches. Otherwise: exit 2 and one stderr line naming CUDA.
string(REPLACE "|" ";" ARGS "${ARGS}")
set(gpu FALSE)
find_program(NVIDIA_SMI nvidia-smi)
if(WITH_CUDA AND NVIDIA_SMI)
  execute_process(COMMAND ${NVIDIA_SMI} -L RESULT_VARIABLE smi_rc OUTPUT_VARIABLE smi_out
                  ERROR_QUIET)
  if(smi_rc EQUAL 0 AND smi_out MATCHES "GPU [0-9]")
    set(gpu TRUE)
  endif()
endif()

execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(gpu)
  if(NOT rc STREQUAL "0" OR NOT out MATCHES "agreement: contiguous vs paged-cuda: same tokens")
    message(FATAL_ERROR "GPU present: expected exit 0 and the device run agreeing with the CPU "
                        "caches; got exit ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "GPU run agrees with the CPU caches")
else()
  if(NOT rc STREQUAL "2" OR NOT err MATCHES "^pagedkv generate: no CUDA device: [^\n]+\n$")
    message(FATAL_ERROR "no CUDA device (CUDA build: ${WITH_CUDA}): expected exit 2 and one line "
                        "'pagedkv generate: no CUDA device: ...'; got exit ${rc}\n"
                        "stdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "no CUDA device: exit 2 as expected; stderr: ${err}")
endif()

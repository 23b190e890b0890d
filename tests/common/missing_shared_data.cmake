# Stands in for a test whose ../shared data is missing (see shared_data.cmake): fails under
# CI=true, else prints the reason ctest reads as a skip.   -DTEST=<name> -DMISSING=<f1|f2|...>
string(REPLACE "|" ", " _files "${MISSING}")
if("$ENV{CI}" STREQUAL "true")
  message(FATAL_ERROR "${TEST}: CI=true but its shared data is missing: ${_files}")
endif()
message("pagedkv-skip: ${TEST}: missing ${_files}")

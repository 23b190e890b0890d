# `pagedkv ops` (issue 4): the script engine's tests (the worked examples of docs/ops-script.md
# among them) and the CLI's exit status on an invalid line.
if(NOT TARGET pagedkv_ops)
  return()
endif()
add_executable(ops_test_ops_script ${CMAKE_CURRENT_SOURCE_DIR}/ops/test_ops_script.cpp)
target_link_libraries(ops_test_ops_script PRIVATE pagedkv_ops pagedkv::pagedkv GTest::gtest
                                                  GTest::gtest_main GTest::gmock)
target_include_directories(ops_test_ops_script PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(ops_test_ops_script PRIVATE PAGEDKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# One label only, as in tests/sim.cmake: gtest_discover_tests writes PROPERTIES unquoted, so
# "unit;ops" became LABELS unit plus a stray property named ops, and `ctest -L ops` missed these.
gtest_discover_tests(ops_test_ops_script DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS ops)
# Issue 16: limits against hostile scripts, the reader, expect_error, dump and batch_metadata.
add_executable(ops_test_ops_limits ${CMAKE_CURRENT_SOURCE_DIR}/ops/test_ops_limits.cpp)
target_link_libraries(ops_test_ops_limits PRIVATE pagedkv_ops pagedkv::pagedkv GTest::gtest
                                                  GTest::gtest_main GTest::gmock)
target_include_directories(ops_test_ops_limits PRIVATE ${PROJECT_SOURCE_DIR}/src)
gtest_discover_tests(ops_test_ops_limits DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS ops)

if(TARGET pagedkv_cli)
  # A good script from a file: exit 0 and JSON on stdout.
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ops_ok.ops "manager blocks=2 block_size=2\nadd 1 1 2 3\nstats\n")
  add_test(NAME ops.cli_script_file
           COMMAND pagedkv_cli ops ${CMAKE_CURRENT_BINARY_DIR}/ops_ok.ops)
  set_tests_properties(ops.cli_script_file PROPERTIES LABELS "cli;ops"
    PASS_REGULAR_EXPRESSION "\"op\":\"stats\",\"line\":3")
  # An invalid line from stdin: exactly exit status 2 and one line naming the line number.
  add_test(NAME ops.cli_invalid_line_exits_2
           COMMAND sh -c "printf 'manager blocks=1\\nadd 1 5\\nbogus 1\\n' | \"$1\" ops 2>&1; test $? -eq 2"
                   sh $<TARGET_FILE:pagedkv_cli>)
  set_tests_properties(ops.cli_invalid_line_exits_2 PROPERTIES LABELS "cli;ops"
    PASS_REGULAR_EXPRESSION "pagedkv ops: line 3: unknown op 'bogus'")
  # An explicitly empty path is an error (exit 2), not stdin: stdin here holds a valid script,
  # which must not run.
  add_test(NAME ops.cli_empty_path_exits_2
           COMMAND sh -c "printf 'manager blocks=1\nstats\n' | \"$1\" ops '' 2>&1; test $? -eq 2"
                   sh $<TARGET_FILE:pagedkv_cli>)
  set_tests_properties(ops.cli_empty_path_exits_2 PROPERTIES LABELS "cli;ops"
    PASS_REGULAR_EXPRESSION "^pagedkv ops: the script path is empty[^\n]*\n$")
endif()

add_executable(ops_test_ops_hybrid ${CMAKE_CURRENT_SOURCE_DIR}/ops/test_ops_hybrid.cpp)
target_link_libraries(ops_test_ops_hybrid PRIVATE pagedkv_ops pagedkv::pagedkv GTest::gtest
                                                  GTest::gtest_main GTest::gmock)
target_include_directories(ops_test_ops_hybrid PRIVATE ${PROJECT_SOURCE_DIR}/src)
gtest_discover_tests(ops_test_ops_hybrid DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS ops)

# Model layer and `pagedkv generate` tests (issue 3). Only when the CLI/model targets exist.
if(NOT TARGET pagedkv_model)
  return()
endif()
find_package(nlohmann_json REQUIRED)

# One executable per tests/model/test_*.cpp.
file(GLOB PAGEDKV_MODEL_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/model/test_*.cpp)
foreach(src IN LISTS PAGEDKV_MODEL_TEST_SOURCES)
  get_filename_component(name ${src} NAME_WE)
  set(name model_${name})
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE pagedkv_model pagedkv::pagedkv nlohmann_json::nlohmann_json
                                        GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE
    PAGEDKV_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared"
    PAGEDKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS model)
endforeach()

if(NOT TARGET pagedkv_cli)
  return()
endif()
# The CLI end to end: the built `pagedkv` binary, its output and its exit codes.
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_exit.cmake)
set(_scratch ${CMAKE_CURRENT_BINARY_DIR}/cli-scratch)
set(_shared ${PROJECT_SOURCE_DIR}/../shared)

add_test(NAME cli.generate.builtin_all_modes
  COMMAND pagedkv_cli generate --steps 40 --prompts ${CMAKE_CURRENT_SOURCE_DIR}/model/prompts.txt)
set_tests_properties(cli.generate.builtin_all_modes PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "agreement: none vs paged: same tokens.*speedup vs none: paged")

add_test(NAME cli.generate.json
  COMMAND pagedkv_cli generate --steps 12 --cache paged --json)
set_tests_properties(cli.generate.json PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "\"cache\": \"paged\"")

add_test(NAME cli.generate.steps_capped
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=0
          "-DARGS=generate|--steps|100000|--cache|paged"
          "-DSTDERR_REGEX=^pagedkv generate: notice: --steps 100000 exceeds the model's seq_len 512: capped at 512\n$"
          -P ${_expect})
set_tests_properties(cli.generate.steps_capped PROPERTIES LABELS cli)

# Bad input: one line on stderr naming the problem, exit 2.
add_test(NAME cli.generate.bad_model_file
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          -DBAD_FILE=${_scratch}/bad_model.bin "-DBAD_CONTENT=this is not a llama2.c checkpoint"
          "-DARGS=generate|--model|${_scratch}/bad_model.bin|--tokenizer|${_scratch}/bad_model.bin"
          "-DSTDERR_REGEX=^pagedkv generate: model file [^\n]*bad_model.bin: [^\n]+\n$"
          -P ${_expect})
add_test(NAME cli.generate.missing_model_file
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--model|${_scratch}/does_not_exist.bin|--tokenizer|${_scratch}/does_not_exist.bin"
          "-DSTDERR_REGEX=^[^\n]*does_not_exist.bin[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.generate.bad_cache_flag
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--cache|sideways" "-DSTDERR_REGEX=^[^\n]*sideways[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.generate.prompt_longer_than_steps
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--steps|3|--prompt|a long prompt that does not fit"
          "-DSTDERR_REGEX=^pagedkv generate: prompt 0 is [0-9]+ tokens, more than the 3 positions[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.no_subcommand
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2 "-DARGS="
          "-DSTDERR_REGEX=^pagedkv: [^\n]*\n$" -P ${_expect})
add_test(NAME cli.generate.bad_device_flag
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--device|gpu"
          "-DSTDERR_REGEX=^pagedkv generate: [^\n]*--device[^\n]*gpu[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.generate.device_cuda_other_cache
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--device|cuda|--cache|contiguous"
          "-DSTDERR_REGEX=^pagedkv generate: --device cuda runs the paged cache[^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.generate.bad_model_file cli.generate.missing_model_file
  cli.generate.bad_cache_flag cli.generate.prompt_longer_than_steps cli.no_subcommand
  cli.generate.bad_device_flag cli.generate.device_cuda_other_cache
  PROPERTIES LABELS cli)

# --device cuda: exit 2 with one line naming CUDA without a GPU (this CI), the device run
# agreeing with the CPU caches with one (see the script).
add_test(NAME cli.generate.device_cuda
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DWITH_CUDA=${PAGEDKV_WITH_CUDA}
          "-DARGS=generate|--device|cuda|--steps|8|--prompt|Once"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_device_generate.cmake)
set_tests_properties(cli.generate.device_cuda PROPERTIES LABELS cli)

# The real model: the reference runtime's greedy output for the issue's prompt, all three caches.
if(EXISTS ${_shared}/models/stories260K.bin)
  add_test(NAME cli.generate.stories260K_big_bear_512
    COMMAND pagedkv_cli generate --model ${_shared}/models/stories260K.bin
            --tokenizer ${_shared}/models/tok512.bin --prompt "One day, a big bear" --steps 512)
  set_tests_properties(cli.generate.stories260K_big_bear_512 PROPERTIES LABELS cli
    PASS_REGULAR_EXPRESSION "It was not a ball. It was a ball\n.*agreement: contiguous vs paged: same tokens.*agreement: none vs paged: same tokens.*speedup vs none")
endif()

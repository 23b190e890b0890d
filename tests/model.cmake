# Model layer and `pagedkv generate` tests (issue 3). Only when the CLI/model targets exist.

# The committed default model (models/): the bytes the issue names, stated in models/README.md.
add_test(NAME models.sha256
  COMMAND ${CMAKE_COMMAND} -DMODELS=${PROJECT_SOURCE_DIR}/models
          -P ${CMAKE_CURRENT_SOURCE_DIR}/model/check_models.cmake)
set_tests_properties(models.sha256 PROPERTIES LABELS model)

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
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS model)
endforeach()

if(NOT TARGET pagedkv_cli)
  return()
endif()
# The CLI end to end: the built `pagedkv` binary, its output and its exit codes.
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_exit.cmake)
set(_scratch ${CMAKE_CURRENT_BINARY_DIR}/cli-scratch)
set(_shared ${PROJECT_SOURCE_DIR}/../shared)

set(_models ${PROJECT_SOURCE_DIR}/models)

# No options: the real model from models/ (found through the compiled-in source path in a build
# tree; tests/consumer.cmake checks the installed lookup) tells a story, all three caches agree.
add_test(NAME cli.generate.default_model COMMAND pagedkv_cli generate)
set_tests_properties(cli.generate.default_model PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "^model: [^\n]*/models/stories260K.bin [^\n]*\n.*\nOnce upon a time, there was a little girl named Lily[.] .*agreement: contiguous vs paged: same tokens.*agreement: none vs paged: same tokens")

# The random model keeps its shape flags for shape and speed experiments.
add_test(NAME cli.generate.random_all_modes
  COMMAND pagedkv_cli generate --model random --steps 40
          --prompts ${CMAKE_CURRENT_SOURCE_DIR}/model/prompts.txt)
set_tests_properties(cli.generate.random_all_modes PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "^model: random Llama .*agreement: none vs paged: same tokens.*speedup vs none: paged")
add_test(NAME cli.generate.random_shape
  COMMAND pagedkv_cli generate --model random --dim 128 --hidden-dim 256 --layers 2 --heads 4
          --kv-heads 2 --vocab 300 --seq-len 64 --steps 24 --json)
set_tests_properties(cli.generate.random_shape PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "\"source\": \"random\",\n    \"dim\": 128,\n    \"hidden_dim\": 256,\n    \"n_layers\": 2,\n    \"n_heads\": 4,\n    \"n_kv_heads\": 2,\n    \"vocab_size\": 300,\n    \"seq_len\": 64")

add_test(NAME cli.generate.json
  COMMAND pagedkv_cli generate --steps 12 --cache paged --json)
set_tests_properties(cli.generate.json PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "\"source\": \"[^\"]*/models/stories260K.bin\".*\"cache\": \"paged\"")

# An 8-bit paged cache beside the fp32 references: the run succeeds and the agreement lines are
# reported as a measurement of the 8-bit error (issue 19).
add_test(NAME cli.generate.kv_dtype_int8
  COMMAND pagedkv_cli generate --steps 60 --kv-dtype int8)
set_tests_properties(cli.generate.kv_dtype_int8 PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "int8 paged KV.*agreement: contiguous vs paged: [^\n]*max [|]logit diff[|] [^\n]*\n.*the paged cache stores int8 K/V, the others fp32: the agreement lines measure its error")
# --kv-nmse: one NMSE line per storage dtype, teacher-forced on the real model's K/V (issue 19);
# refused beside a paged cache that is not fp32.
add_test(NAME cli.generate.kv_nmse
  COMMAND pagedkv_cli generate --steps 60 --cache paged --kv-nmse)
set_tests_properties(cli.generate.kv_nmse PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "KV storage error, teacher-forced[^\n]*\n  fp16 +NMSE [0-9][^\n]*\n  bf16 +NMSE [0-9][^\n]*\n  int8 +NMSE [0-9][^\n]*\n  fp8_e4m3 +NMSE [0-9][^\n]*\n  fp8_e5m2 +NMSE [0-9][^\n]*over [0-9]+ outputs\n")
add_test(NAME cli.generate.kv_scale_headroom_range
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--kv-dtype|int8|--kv-scale-headroom|0.5"
          "-DSTDERR_REGEX=^pagedkv generate: --kv-scale-headroom[^\n]*0.5[^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.generate.kv_scale_headroom_range PROPERTIES LABELS cli)
add_test(NAME cli.generate.kv_nmse_needs_fp32
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--steps|20|--kv-nmse|--kv-dtype|int8"
          "-DSTDERR_REGEX=^pagedkv generate: --kv-nmse compares [^\n]* on the cpu: drop --kv-dtype int8\n$"
          -P ${_expect})
set_tests_properties(cli.generate.kv_nmse_needs_fp32 PROPERTIES LABELS cli)
add_test(NAME cli.generate.kv_dtype_unknown
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--kv-dtype|fp9"
          "-DSTDERR_REGEX=^pagedkv generate: --kv-dtype: unknown dtype 'fp9' [^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.generate.kv_dtype_unknown PROPERTIES LABELS cli)

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
# A prompt longer than --steps: refused by the bound before encoding (31 bytes need at least
# 1 + 31 / 7 tokens with tok512's longest piece of 7 bytes), or after encoding when the bound
# lets it through ("a b c d e f" is 7 tokens), or by the bound in bounded time for a 200 kB
# prompt (encoding it, O(n^2), would take many minutes).
add_test(NAME cli.generate.prompt_longer_than_steps
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--steps|3|--prompt|a long prompt that does not fit"
          "-DSTDERR_REGEX=^pagedkv generate: prompt 0 is at least 6 tokens \\(31 bytes, at most 7 a token\\), more than the 3 positions[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.generate.prompt_longer_than_steps_after_encoding
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--steps|5|--prompt|a b c d e f"
          "-DSTDERR_REGEX=^pagedkv generate: prompt 0 is 7 tokens, more than the 5 positions[^\n]*\n$"
          -P ${_expect})
string(REPEAT "a b " 50000 _long_prompt)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/long_prompt.txt "${_long_prompt}\n")
add_test(NAME cli.generate.huge_prompt_refused_before_encoding
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--steps|8|--prompts|${CMAKE_CURRENT_BINARY_DIR}/long_prompt.txt"
          "-DSTDERR_REGEX=^pagedkv generate: prompt 0 is at least 28573 tokens \\(200000 bytes[^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.generate.huge_prompt_refused_before_encoding PROPERTIES TIMEOUT 60)
# --seed is a uint64: "-1" and 2^64 are refused (CLI11 alone turned both into 2^64 - 1).
foreach(_seed IN ITEMS -1 18446744073709551616)
  add_test(NAME cli.generate.seed_out_of_range_${_seed}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
            "-DARGS=generate|--seed|${_seed}"
            "-DSTDERR_REGEX=^pagedkv generate: --seed: must be a decimal integer in \\[0, 18446744073709551615\\], got ${_seed}[^\n]*\n$"
            -P ${_expect})
endforeach()
add_test(NAME cli.generate.shape_flag_needs_random
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--layers|2"
          "-DSTDERR_REGEX=^pagedkv generate: --layers needs --model random[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.generate.random_with_tokenizer
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--model|random|--tokenizer|${_models}/tok512.bin"
          "-DSTDERR_REGEX=^pagedkv generate: --model random [^\n]*--tokenizer\n$"
          -P ${_expect})
add_test(NAME cli.generate.random_bad_shape
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=generate|--model|random|--heads|3"
          "-DSTDERR_REGEX=^pagedkv generate: --model random: n_heads 3 is not a multiple of n_kv_heads 4\n$"
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
  cli.generate.shape_flag_needs_random cli.generate.random_with_tokenizer
  cli.generate.random_bad_shape
  cli.generate.bad_device_flag cli.generate.device_cuda_other_cache
  PROPERTIES LABELS cli)

# --device cuda: exit 2 with one line naming CUDA without a GPU (this CI), the device run
# agreeing with the CPU caches with one (see the script): the random model (head_dim 64, the fast
# kernel) and the real one (stories260K, head_dim 8: the generic kernel).
add_test(NAME cli.generate.device_cuda
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DWITH_CUDA=${PAGEDKV_WITH_CUDA}
          "-DARGS=generate|--model|random|--device|cuda|--steps|8|--prompt|Once"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_device_generate.cmake)
set_tests_properties(cli.generate.device_cuda PROPERTIES LABELS cli)
add_test(NAME cli.generate.device_cuda_stories260K
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DWITH_CUDA=${PAGEDKV_WITH_CUDA}
          "-DARGS=generate|--model|${_models}/stories260K.bin|--tokenizer|${_models}/tok512.bin|--device|cuda|--steps|64|--prompt|One day, a big bear"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_device_generate.cmake)
set_tests_properties(cli.generate.device_cuda_stories260K PROPERTIES LABELS cli)

# The real model (the committed copy in models/, the same bytes as ../shared/models): the
# reference runtime's greedy output for the issue's prompt, all three caches.
add_test(NAME cli.generate.stories260K_big_bear_512
  COMMAND pagedkv_cli generate --model ${_models}/stories260K.bin --tokenizer ${_models}/tok512.bin
          --prompt "One day, a big bear" --steps 512)
set_tests_properties(cli.generate.stories260K_big_bear_512 PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "It was not a ball. It was a ball\n.*agreement: contiguous vs paged: same tokens.*agreement: none vs paged: same tokens.*speedup vs none")
# The default run's text is the reference runtime's, byte for byte (../shared/reference).
pagedkv_add_shared_data_test(NAME cli.generate.default_model_matches_reference
  FILES ${_shared}/reference/llama2c/p01_once_upon_a_time_n200.stdout
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli>
          "-DARGS=generate|--steps|200|--cache|paged|--json"
          -DREFERENCE=${_shared}/reference/llama2c/p01_once_upon_a_time_n200.stdout
          "-DSOURCE_REGEX=/models/stories260K.bin$"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_reference_text.cmake)
set_tests_properties(cli.generate.default_model_matches_reference PROPERTIES LABELS cli)

# A layer pattern (issue 17 item 5): stories260K's 5 layers as 4 window-16 layers and 1 full
# layer; the hybrid paged cache agrees with the contiguous and none modes under the same
# per-layer masks, and each window group holds the 5 blocks (block size 4) that positions
# 105..120 of the 121-token run touch.
add_test(NAME cli.generate.layer_pattern
         COMMAND pagedkv_cli generate --layer-pattern SSSSF --window 16 --steps 128 --block-size 4)
set_tests_properties(cli.generate.layer_pattern PROPERTIES LABELS "model;cli"
  PASS_REGULAR_EXPRESSION "agreement: contiguous vs paged: same tokens[^\n]*\nagreement: none vs paged: same tokens.*KV cache groups of the paged run [(]layer pattern SSSSF, one pool, 5 groups[)]:\n  group 0: window 16 +1 layer +5 blocks.*  group 4: full +1 layer +31 blocks.*x less")
foreach(_case
    "window_without_pattern|generate|--window|8|apply to the layers of a --layer-pattern"
    "bad_letter|generate|--layer-pattern|SFX|--window|8|letter 'X' at index 2"
    "no_window|generate|--layer-pattern|SF|S layers need a window >= 1, got 0"
    "prefix_caching|generate|--layer-pattern|SF|--window|8|--prefix-caching|no prefix caching")
  string(REPLACE "|" ";" _parts "${_case}")
  list(POP_FRONT _parts _name)
  list(POP_BACK _parts _regex)
  string(REPLACE ";" "|" _args "${_parts}")
  add_test(NAME cli.generate.layer_pattern_${_name}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2 "-DARGS=${_args}"
            "-DSTDERR_REGEX=${_regex}" -P ${_expect})
  set_tests_properties(cli.generate.layer_pattern_${_name} PROPERTIES LABELS "model;cli")
endforeach()

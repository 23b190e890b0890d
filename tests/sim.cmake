# Simulation tests (issue 6): trace readers, replay, presets, memory growth, reports. One
# executable per tests/sim/test_*.cpp. The measured-model test needs pagedkv_sim_model (built
# with the CLI); without it those cases compile out.
if(NOT TARGET pagedkv_sim)
  return()
endif()

file(GLOB PAGEDKV_SIM_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/sim/test_*.cpp)
foreach(src IN LISTS PAGEDKV_SIM_TEST_SOURCES)
  get_filename_component(name ${src} NAME_WE)
  set(name sim_${name})
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE pagedkv_sim GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR}
                             ${CMAKE_CURRENT_SOURCE_DIR}/sim)
  target_compile_definitions(${name} PRIVATE PAGEDKV_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
  if(TARGET pagedkv_sim_model)
    target_link_libraries(${name} PRIVATE pagedkv_sim_model)
    target_compile_definitions(${name} PRIVATE PAGEDKV_HAVE_MODEL=1)
  else()
    target_compile_definitions(${name} PRIVATE PAGEDKV_HAVE_MODEL=0)
  endif()
  # One label only: gtest_discover_tests writes PROPERTIES unquoted, so "unit;sim" would become
  # LABELS unit plus a stray property named sim.
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS sim)
endforeach()

if(NOT TARGET pagedkv_cli)
  return()
endif()
# `pagedkv replay` and `pagedkv memory` end to end: output and the exit-code contract (bad input:
# one line on stderr, exit 2). Small fixture traces are written at configure time.
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/sim/expect_exit.cmake)
set(_fx ${CMAKE_CURRENT_BINARY_DIR}/sim-fixtures)
set(_shared ${PROJECT_SOURCE_DIR}/../shared)
file(WRITE ${_fx}/good.csv "TIMESTAMP,ContextTokens,GeneratedTokens\n"
  "2023-11-16 18:15:46.1,100,20\n2023-11-16 18:15:46.2,200,10\n2023-11-16 18:15:47,50,5\n")
file(WRITE ${_fx}/bad_row.csv "TIMESTAMP,ContextTokens,GeneratedTokens\n"
  "2023-11-16 18:15:46,100,20\n2023-11-16 18:15:47,abc,5\n2023-11-16 18:15:48,50,5\n")
file(WRITE ${_fx}/out_of_order.jsonl
  "{\"timestamp\": 100, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2]}\n"
  "{\"timestamp\": 50, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [3]}\n")
file(WRITE ${_fx}/no_column.csv "TIMESTAMP,Prompt,GeneratedTokens\n2023-11-16 18:15:46,1,1\n")

add_test(NAME cli.replay.small_trace_all_strategies
  COMMAND pagedkv_cli replay --trace ${_fx}/good.csv --preset stories260k --kv-memory 1MiB
          --svg ${_fx}/good.svg)
set_tests_properties(cli.replay.small_trace_all_strategies PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "3 rows read, 3 requests, 0 skipped.*\\| contiguous-max \\|.*\\| paged-128 \\|.*\\| prefix-16 \\|.*plot: ")
add_test(NAME cli.replay.skips_bad_row_by_default
  COMMAND pagedkv_cli replay --trace ${_fx}/bad_row.csv --preset stories260k --kv-memory 1MiB)
set_tests_properties(cli.replay.skips_bad_row_by_default PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "skipped [^\n]*bad_row.csv:3: ContextTokens 'abc' is not a whole number.*3 rows read, 2 requests, 1 skipped")
# Sharing workloads on the hand-worked groups of tests/sim/test_sharing.cpp (block size 4):
# P 5 / O 5 holds 19 block-steps shared vs 24 independent, P 8 / O 1 4 vs 6: 1 - 23/30 saved.
file(WRITE ${_fx}/sharing.csv "TIMESTAMP,ContextTokens,GeneratedTokens\n"
  "2023-11-16 18:15:46.0,5,5\n2023-11-16 18:15:47.0,8,1\n")
add_test(NAME cli.replay.parallel_samples_hand_worked
  COMMAND pagedkv_cli replay --trace ${_fx}/sharing.csv --strategies paged-4
          --parallel-samples 1,2)
set_tests_properties(cli.replay.parallel_samples_hand_worked PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "block size 4 \\(2 requests in the trace\\).*parallel-1 +2 +6 +0.0% [^\n]* 1.000 .*parallel-2 +2 +6 +23.3% +6.1-9.8% +1.304 ")
# The timed replay of the same groups: 2 x 5 + 2 x 1 tokens generated.
add_test(NAME cli.replay.sharing_timed_groups
  COMMAND pagedkv_cli replay --trace ${_fx}/sharing.csv --strategies paged-4,contiguous-exact
          --sharing parallel-2 --json --no-progress)
set_tests_properties(cli.replay.sharing_timed_groups PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "\"generated_tokens\": 12,.*\"generated_tokens\": 12,")
# Tiers below the pool, the hand-worked case of tests/sim/test_replay_tiers.cpp with
# stories260K (1280 bytes per token): a pool of 9 blocks of 16 (184320 bytes), a host tier of
# 8 blocks (163840 bytes); r1 evicts r0's prefix, r2 repeats it and loads (128 - 1) / 16 = 7
# blocks, 112 tokens, from the host tier.
file(WRITE ${_fx}/evicted_prefix.jsonl
  "{\"timestamp\": 0, \"input_length\": 128, \"output_length\": 1, \"hash_ids\": [1]}\n"
  "{\"timestamp\": 1000, \"input_length\": 128, \"output_length\": 1, \"hash_ids\": [2]}\n"
  "{\"timestamp\": 2000, \"input_length\": 128, \"output_length\": 1, \"hash_ids\": [1]}\n")
add_test(NAME cli.replay.host_tier_hand_worked
  COMMAND pagedkv_cli replay --trace ${_fx}/evicted_prefix.jsonl --preset stories260k
          --kv-memory 184320 --strategies prefix-16 --tier-host 163840 --no-progress)
set_tests_properties(cli.replay.host_tier_hand_worked PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "\\| prefix-16 \\| pool \\| 9 \\| 0 \\|.*\\| prefix-16 \\| host \\| 8 \\| 112 \\| 0.292 \\| 16 \\| 8 \\|")
# Hybrid vs all-full allocation on Gemma-3-27B (10 full + 52 window-1024 layers): three 4000 +
# 200 requests at 4 GiB. paged-16 holds 263 blocks of 16 x 62 layers per request at its end and
# runs two at once (528 blocks); hybrid-16 (7 groups of 10 layers, 3276 pages of 1.25 MiB)
# holds 1750 pages at admission, 640 after the first decode released the window groups'
# history, so all three run and the trace takes 205 steps instead of 402.
file(WRITE ${_fx}/hybrid.csv "TIMESTAMP,ContextTokens,GeneratedTokens\n"
  "2023-11-16 18:15:46.0,4000,200\n2023-11-16 18:15:46.0,4000,200\n2023-11-16 18:15:46.1,4000,200\n")
add_test(NAME cli.replay.hybrid_vs_paged_gemma3
  COMMAND pagedkv_cli replay --trace ${_fx}/hybrid.csv --preset gemma-3-27b --kv-memory 4GiB
          --strategies paged-16,hybrid-16 --no-progress)
set_tests_properties(cli.replay.hybrid_vs_paged_gemma3 PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "hybrid-16: 7 KV cache groups of 10 layers \\(8 padded layer slots, 12.9% of 62\\), pages of 16 tokens x 10 layers = 1.25 MiB, 3276 pages.*\\| paged-16 \\| 0.998 \\| 0.996 \\| 0.370 \\| 0.002 \\| 2 \\| 1.5 \\| 0 \\|[^\n]*\\| 3 \\| 0 \\| 402 \\|.*\\| hybrid-16 \\| 0.905 \\| 0.910 \\| 0.905 \\| 0.095 \\| 3 \\| 2.9 \\| 0 \\|[^\n]*\\| 3 \\| 0 \\| 205 \\|")
# What hybrid-16 does not support yet (HybridKVCacheManager, issue 17): exit 2, one line.
add_test(NAME cli.replay.hybrid_refuses_swap
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/hybrid.csv\;--preset\;gemma-3-27b\;--strategies\;paged-16,hybrid-16\;--preemption\;swap"
          "-DSTDERR_REGEX=^pagedkv replay: replay: strategy hybrid-16 supports recompute preemption only [^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.hybrid_prefix_not_available
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/hybrid.csv\;--strategies\;hybrid-prefix-16"
          "-DSTDERR_REGEX=^pagedkv replay: strategy 'hybrid-prefix-16': prefix caching with hybrid allocation is not available yet[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.hybrid_refuses_sharing
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/hybrid.csv\;--preset\;gemma-3-27b\;--strategies\;hybrid-16\;--sharing\;parallel-2"
          "-DSTDERR_REGEX=^pagedkv replay: replay: strategy hybrid-16 does not run sharing groups \\(width 2\\)[^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.replay.hybrid_refuses_swap cli.replay.hybrid_prefix_not_available
  cli.replay.hybrid_refuses_sharing PROPERTIES LABELS "cli;sim")
# The default strategies leave hybrid-16 out, with a notice, when the options exclude it.
add_test(NAME cli.replay.default_strategies_swap_leave_hybrid_out
  COMMAND pagedkv_cli replay --trace ${_fx}/hybrid.csv --preset gemma-3-27b --kv-memory 4GiB
          --preemption swap --no-progress)
set_tests_properties(cli.replay.default_strategies_swap_leave_hybrid_out PROPERTIES
  LABELS "cli;sim" PASS_REGULAR_EXPRESSION "\\| prefix-16 \\|" FAIL_REGULAR_EXPRESSION "hybrid-16 \\|")
add_test(NAME cli.replay.json
  COMMAND pagedkv_cli replay --trace ${_fx}/good.csv --preset stories260k --kv-memory 1MiB
          --strategies paged-16 --json)
set_tests_properties(cli.replay.json PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "\"strategy\": \"paged-16\"")

# Bad input: exit 2 and one line naming the problem.
add_test(NAME cli.replay.strict_bad_row
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/bad_row.csv\;--strict"
          "-DSTDERR_REGEX=^pagedkv replay: [^\n]*bad_row.csv:3: ContextTokens 'abc' is not a whole number \\(--strict\\)\n$"
          -P ${_expect})
add_test(NAME cli.replay.strict_out_of_order
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/out_of_order.jsonl\;--strict"
          "-DSTDERR_REGEX=^pagedkv replay: [^\n]*out_of_order.jsonl:2: timestamp -0.050 s is earlier[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.missing_column
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/no_column.csv"
          "-DSTDERR_REGEX=^pagedkv replay: [^\n]*no_column.csv:1: missing column 'ContextTokens'[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.missing_file
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/does_not_exist.csv"
          "-DSTDERR_REGEX=^pagedkv replay: cannot read trace '[^\n]*does_not_exist.csv': no such file\n$"
          -P ${_expect})
add_test(NAME cli.replay.directory
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}"
          "-DSTDERR_REGEX=^pagedkv replay: cannot read trace '[^\n]*': is a directory\n$"
          -P ${_expect})
add_test(NAME cli.replay.only_bad_rows
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/no_rows.csv" -DBAD_FILE=${_fx}/no_rows.csv
          "-DBAD_CONTENT=TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1\n"
          "-DSTDERR_REGEX=pagedkv replay: trace '[^\n]*no_rows.csv' has no valid request \\(1 rows read, 1 skipped\\)\n$"
          -P ${_expect})
add_test(NAME cli.replay.bad_kv_memory
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/good.csv\;--kv-memory\;40XB"
          "-DSTDERR_REGEX=^pagedkv replay: invalid memory size '40XB': unknown unit 'XB'[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.budget_below_one_block
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/good.csv\;--kv-memory\;1MiB"
          "-DSTDERR_REGEX=^pagedkv replay: replay: KV memory 1048576 bytes holds no block of 16 tokens[^\n]*\n$"
          -P ${_expect})
add_test(NAME cli.replay.unknown_strategy
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/good.csv\;--strategies\;buddy-16"
          "-DSTDERR_REGEX=^pagedkv replay: unknown strategy 'buddy-16'[^\n]*\n$" -P ${_expect})
add_test(NAME cli.replay.unknown_hardware
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/good.csv\;--hardware\;tpu"
          "-DSTDERR_REGEX=^pagedkv replay: unknown hardware preset 'tpu' \\(known: a100-40gb, a100-80gb, h100-sxm, h200\\)\n$"
          -P ${_expect})
add_test(NAME cli.replay.hardware_needs_parameter_count
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=replay\;--trace\;${_fx}/good.csv\;--preset\;builtin\;--hardware\;h200"
          "-DSTDERR_REGEX=^pagedkv replay: step-time model: model 'builtin' has no parameter count[^\n]*\n$"
          -P ${_expect})
# The roofline model and swap preemption end to end (llama-3-8b: 16 GB of weights on an H200 at
# half bandwidth -> steps of about 7.7 ms; the header names the model).
add_test(NAME cli.replay.hardware_and_swap
  COMMAND pagedkv_cli replay --trace ${_fx}/good.csv --preset llama-3-8b --kv-memory 1GiB
          --strategies paged-16 --hardware h200 --preemption swap --json)
set_tests_properties(cli.replay.hardware_and_swap PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "\"preemption\": \"swap\".*\"step_model\": \"roofline\".*\"mean_step_ms\": 7\\.[0-9]+")
add_test(NAME cli.memory.unknown_preset
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
          "-DARGS=memory\;--preset\;llama-9" "-DSTDERR_REGEX=^pagedkv memory: unknown model preset 'llama-9'[^\n]*\n$"
          -P ${_expect})
set_tests_properties(cli.replay.strict_bad_row cli.replay.strict_out_of_order
  cli.replay.missing_column cli.replay.missing_file cli.replay.directory cli.replay.only_bad_rows
  cli.replay.bad_kv_memory cli.replay.budget_below_one_block cli.replay.unknown_strategy
  cli.memory.unknown_preset PROPERTIES LABELS "cli;sim")

add_test(NAME cli.memory.builtin_measured_matches_formula
  COMMAND pagedkv_cli memory --preset llama-2-7b --kv-memory 40GiB --measure-tokens 64
          --svg ${_fx}/memory.svg)
set_tests_properties(cli.memory.builtin_measured_matches_formula PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "= 2 x 32 x 32 x 128 x 2 = 524288 bytes.*\\| 1000 \\| 500.00 MiB \\| 504.00 MiB \\| 2.00 GiB \\| 81 \\| 20 \\|.*check: contiguous == formula at 48/48 steps; paged == formula rounded up to 16-token blocks at 48/48 steps")
add_test(NAME cli.memory.csv_explicit_geometry
  COMMAND pagedkv_cli memory --layers 2 --kv-heads 1 --head-dim 4 --dtype fp16 --max-context 32
          --no-measure --csv)
set_tests_properties(cli.memory.csv_explicit_geometry PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "^table,step,tokens,formula_bytes,[^\n]*\ngrowth,,1,32,32,512,1024,0,0,,,512\n")
# Gemma-3-27B (10 full + 52 window-1024 layers): at 32k the hybrid cache holds 10 x 32768 +
# 52 x 1024 positions' worth of one layer instead of 62 x 32768, 5.33x less.
add_test(NAME cli.memory.gemma3_hybrid_groups
  COMMAND pagedkv_cli memory --preset gemma-3-27b --no-measure)
set_tests_properties(cli.memory.gemma3_hybrid_groups PROPERTIES LABELS "cli;sim"
  PASS_REGULAR_EXPRESSION "full attention: 10 layers x 8192 bytes = 81920 bytes per token.*sliding window 1024: 52 layers x 8192 bytes = 425984 bytes per token.*\\| 32768 \\| 15.50 GiB \\| 15.50 GiB \\| 62.00 GiB \\| 2.91 GiB \\| 2.91 GiB \\| 5.33x \\|")

pagedkv_add_shared_data_test(NAME cli.memory.stories260K_whole_context
  FILES ${_shared}/models/stories260K.bin
  COMMAND pagedkv_cli memory --preset stories260k --model ${_shared}/models/stories260K.bin
  PASS_REGEX "2 x 5 x 4 x 8 x 4 = 1280 bytes.*\\| 495 \\| 512 \\| 655360 \\| 655360 \\| 655360 \\| 655360 \\|.*at 496/496 steps; paged == formula rounded up to 16-token blocks at 496/496 steps")
pagedkv_add_shared_data_test(NAME cli.replay.azure_conv_paged16
  FILES ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
  COMMAND pagedkv_cli replay --trace ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
          --preset llama-2-7b --strategies contiguous-max,paged-16
  PASS_REGEX "19366 rows read, 19366 requests, 0 skipped.*1612 requests have prompt \\+ output > max context 4096.*\\| contiguous-max \\| 0.278 \\|.*\\| paged-16 \\| 0.993 \\|")
# A preset too short for the trace: the rejection is said on stderr with the presets that fit.
pagedkv_add_shared_data_test(NAME cli.replay.warns_when_preset_rejects_over_1pct
  FILES ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
  COMMAND ${CMAKE_COMMAND} -E env sh -c "\"$1\" replay --trace \"$2\" --preset llama-2-7b --strategies paged-16 --limit 3000 --no-progress 2>&1 >/dev/null"
          sh $<TARGET_FILE:pagedkv_cli> ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
  PASS_REGEX "^pagedkv replay: warning: 217 of 3000 requests \\(7.2%\\) have prompt \\+ output > the max context 4096 of llama-2-7b and are rejected; the longest needs 7979 positions \\(presets that hold it: llama-3-8b, llama-3.1-8b, llama-3.1-70b, mistral-7b, qwen2.5-7b, gemma-3-27b, gpt-oss-20b, gpt-oss-120b, llama-4-scout\\)\n$")
# A rate sweep with an SLO: paged serves the trace's own rate within 0.1 s/token at 8 GiB, the
# 4096-position reservations of contiguous-max never do.
pagedkv_add_shared_data_test(NAME cli.replay.sweep_max_rate_at_slo
  FILES ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
  COMMAND pagedkv_cli replay --trace ${_shared}/traces/AzureLLMInferenceTrace_conv.csv
          --preset llama-3-8b --kv-memory 8GiB --strategies contiguous-max,paged-16
          --rates 0.5,1,2 --slo-norm-latency 0.1 --no-progress
  PASS_REGEX "SLO: normalized latency <= 0.1 s/token.*\\| x1 \\| paged-16 \\| 19365 \\| 1 \\| 5.51 \\|.*\\| met \\|.*max rate meeting the SLO: contiguous-max: none of the swept rates\nmax rate meeting the SLO: paged-16: x1 ")
set_tests_properties(cli.memory.stories260K_whole_context cli.replay.azure_conv_paged16
  cli.replay.warns_when_preset_rejects_over_1pct cli.replay.sweep_max_rate_at_slo
  PROPERTIES LABELS "cli;sim")

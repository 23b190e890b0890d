# Bad-input corpus (issue 8): the built `pagedkv` CLI on every file of tests/data/bad/ must exit
# 2 with one line on stderr naming the problem, never crash, never allocate for a size the file
# does not hold, and leave no partial output file. The files are made by
# tests/data/bad/make_bad_inputs.py (committed, so CI needs no Python). tests/data/bad/ok/ holds
# valid counterparts: the positive controls prove each case fails for its corruption alone.
# Cases are added as the subcommands land: generate (--model, --tokenizer), replay (--trace).
if(NOT TARGET pagedkv_cli)
  return()
endif()

set(_bad ${CMAKE_CURRENT_SOURCE_DIR}/data/bad)
set(_ok ${_bad}/ok)
set(_driver ${_bad}/check_bad_input.cmake)
set(_scratch ${CMAKE_CURRENT_BINARY_DIR}/bad-input-scratch)
file(MAKE_DIRECTORY ${_scratch})

# pagedkv_bad_input(<name> ARGS <cli args...> [REGEX <re>] [EXPECTED <rc>] [OUT_FILE <path>]
#                   [INPUT <file fed to stdin>] [LAST_LINE] [STDOUT_EMPTY])
function(pagedkv_bad_input name)
  cmake_parse_arguments(A "LAST_LINE;STDOUT_EMPTY" "REGEX;EXPECTED;OUT_FILE;INPUT" "ARGS" ${ARGN})
  string(REPLACE ";" "\\;" _args "${A_ARGS}")
  set(_defs "-DEXE=$<TARGET_FILE:pagedkv_cli>" "-DARGS=${_args}")
  if(DEFINED A_REGEX)
    list(APPEND _defs "-DREGEX=${A_REGEX}")
  endif()
  if(DEFINED A_EXPECTED)
    list(APPEND _defs "-DEXPECTED=${A_EXPECTED}")
  endif()
  if(DEFINED A_OUT_FILE)
    list(APPEND _defs "-DOUT_FILE=${A_OUT_FILE}")
  endif()
  if(DEFINED A_INPUT)
    list(APPEND _defs "-DINPUT=${A_INPUT}")
  endif()
  if(A_LAST_LINE)
    list(APPEND _defs -DLAST_LINE=ON)
  endif()
  if(A_STDOUT_EMPTY)
    list(APPEND _defs -DSTDOUT_EMPTY=ON)
  endif()
  if(PAGEDKV_SANITIZE)
    list(APPEND _defs -DSANITIZED=ON)
  endif()
  add_test(NAME bad_input.${name} COMMAND ${CMAKE_COMMAND} ${_defs} -P ${_driver})
  set_tests_properties(bad_input.${name} PROPERTIES LABELS "bad_input;cli" TIMEOUT 180)
endfunction()

# Splits "name|regex" at the first '|' (the regex may contain more).
function(pagedkv_split_case text out_name out_regex)
  string(FIND "${text}" "|" _at)
  string(SUBSTRING "${text}" 0 ${_at} _n)
  math(EXPR _at "${_at} + 1")
  string(SUBSTRING "${text}" ${_at} -1 _r)
  set(${out_name} "${_n}" PARENT_SCOPE)
  set(${out_regex} "${_r}" PARENT_SCOPE)
endfunction()

# ---- generate --model: corrupt llama2.c checkpoints (the tokenizer is the valid one) ------------
set(_model_cases
  "empty|truncated: 0 bytes"
  "truncated_header|truncated: 12 bytes"
  "zero_dim|dim is 0"
  "negative_layers|n_layers is -3"
  "heads_not_multiple|n_heads 3 is not a multiple of n_kv_heads 2"
  "odd_head_size|head_size [^\n]*odd"
  "huge_dims|(too large|implies)"
  "huge_vocab|(too large|implies)"
  "int_min_vocab|vocab_size"
  "truncated_weights|truncated: [0-9]+ bytes, but its header"
  "trailing_bytes|length mismatch: [0-9]+ bytes, but its header"
  "text_file|[a-z]")
foreach(_case IN LISTS _model_cases)
  pagedkv_split_case("${_case}" _name _what)
  pagedkv_bad_input(generate.model.${_name} STDOUT_EMPTY
    ARGS generate --model ${_bad}/model/${_name}.bin --tokenizer ${_ok}/tokenizer.bin --steps 4
    REGEX "^pagedkv generate: model file [^\n]*${_name}.bin: [^\n]*${_what}[^\n]*\n$")
endforeach()

# ---- generate --tokenizer: corrupt tokenizers for the valid 16-token model ----------------------
set(_tokenizer_cases
  "empty|truncated"
  "truncated_header|truncated"
  "zero_max_len|max_token_length 0"
  "negative_length|length -7"
  "length_over_max|length 9, outside"
  "huge_piece_length|truncated"
  "truncated_mid_token|truncated"
  "too_few_tokens|truncated"
  "trailing_bytes|3 bytes after token 15")
foreach(_case IN LISTS _tokenizer_cases)
  pagedkv_split_case("${_case}" _name _what)
  pagedkv_bad_input(generate.tokenizer.${_name} STDOUT_EMPTY
    ARGS generate --model ${_ok}/model.bin --tokenizer ${_bad}/tokenizer/${_name}.bin --steps 4
    REGEX "^pagedkv generate: tokenizer file [^\n]*${_name}.bin: [^\n]*${_what}[^\n]*\n$")
endforeach()

# Missing files and a directory where a file is expected.
pagedkv_bad_input(generate.model.missing STDOUT_EMPTY
  ARGS generate --model ${_bad}/model/does_not_exist.bin --tokenizer ${_ok}/tokenizer.bin
  REGEX "^pagedkv generate: [^\n]*does_not_exist.bin[^\n]*\n$")
pagedkv_bad_input(generate.model.directory STDOUT_EMPTY
  ARGS generate --model ${_bad}/model --tokenizer ${_ok}/tokenizer.bin
  REGEX "^pagedkv generate: [^\n]*model[^\n]*\n$")
pagedkv_bad_input(generate.tokenizer.directory STDOUT_EMPTY
  ARGS generate --model ${_ok}/model.bin --tokenizer ${_bad}/tokenizer
  REGEX "^pagedkv generate: [^\n]*tokenizer[^\n]*\n$")

# A consistent pair whose 1-token vocabulary cannot hold BOS/EOS (ids 1, 2): found by
# fuzz_tokenizer, it crashed `generate` (encode read past the piece table).
pagedkv_bad_input(generate.vocab_too_small_for_bos_eos STDOUT_EMPTY
  ARGS generate --model ${_bad}/vocab1/model.bin --tokenizer ${_bad}/vocab1/tokenizer.bin --steps 4
  REGEX "^pagedkv generate: [^\n]*vocab[^\n]*\n$")

# Positive control: the valid pair runs.
pagedkv_bad_input(generate.ok_control EXPECTED 0
  ARGS generate --model ${_ok}/model.bin --tokenizer ${_ok}/tokenizer.bin --prompt "once a"
       --steps 8)

# ---- replay --trace: broken rows and files; --svg must not be left behind ---------------------
# Strict mode: the first broken row is an error naming its line.
set(_strict_cases
  "azure_wrong_field_count.csv|:3: "
  "azure_non_numeric.csv|:3: [^\n]*abc"
  "azure_negative_tokens.csv|:3: [^\n]*-5"
  "azure_zero_prompt.csv|:3: "
  "azure_time_backwards.csv|:3: "
  "azure_huge_tokens.csv|:2: "
  "azure_bad_timestamp.csv|:2: [^\n]*yesterday"
  "azure_year_1011.csv|:2: [^\n]*1011"
  "mooncake_invalid_json.jsonl|:2: "
  "mooncake_hash_ids_wrong_length.jsonl|:1: [^\n]*hash_ids"
  "mooncake_negative_output.jsonl|:1: [^\n]*-1"
  "mooncake_wrong_types.jsonl|:1: "
  "mooncake_binary_garbage.jsonl|:1: ")
foreach(_case IN LISTS _strict_cases)
  pagedkv_split_case("${_case}" _file _what)
  string(REGEX REPLACE "\\.[a-z]+$" "" _name "${_file}")
  pagedkv_bad_input(replay.strict.${_name} STDOUT_EMPTY
    ARGS replay --trace ${_bad}/trace/${_file} --strict --no-progress
         --svg ${_scratch}/${_name}.svg
    OUT_FILE ${_scratch}/${_name}.svg
    REGEX "^pagedkv replay: [^\n]*${_file}${_what}[^\n]*\n$")
endforeach()
# File-level problems fail in either mode.
pagedkv_bad_input(replay.empty_file STDOUT_EMPTY
  ARGS replay --trace ${_bad}/trace/azure_empty.csv --no-progress --svg ${_scratch}/empty.svg
  OUT_FILE ${_scratch}/empty.svg
  REGEX "^pagedkv replay: [^\n]*azure_empty.csv:1: [^\n]*empty[^\n]*\n$")
pagedkv_bad_input(replay.missing_column STDOUT_EMPTY
  ARGS replay --trace ${_bad}/trace/azure_missing_column.csv --no-progress
       --svg ${_scratch}/missing_column.svg
  OUT_FILE ${_scratch}/missing_column.svg
  REGEX "^pagedkv replay: [^\n]*azure_missing_column.csv:1: [^\n]*GeneratedTokens[^\n]*\n$")
pagedkv_bad_input(replay.missing_file STDOUT_EMPTY
  ARGS replay --trace ${_bad}/trace/does_not_exist.csv --no-progress
  REGEX "^pagedkv replay: [^\n]*does_not_exist.csv[^\n]*no such file[^\n]*\n$")
pagedkv_bad_input(replay.directory STDOUT_EMPTY
  ARGS replay --trace ${_bad}/trace --no-progress
  REGEX "^pagedkv replay: [^\n]*is a directory[^\n]*\n$")
# Lenient mode with every row broken: the skipped rows are listed (one line each), then the
# error; the last line names the problem.
pagedkv_bad_input(replay.all_rows_bad LAST_LINE STDOUT_EMPTY
  ARGS replay --trace ${_bad}/trace/azure_all_rows_bad.csv --no-progress
       --svg ${_scratch}/all_rows_bad.svg
  OUT_FILE ${_scratch}/all_rows_bad.svg
  REGEX "^pagedkv replay: [^\n]*no valid request[^\n]*\n$")

# Sharing workloads: a width out of range, and a sweep they would silently replace.
# Byte counts past int64: wrapped to negative / 0 bytes, then the contiguous fit divided by 0
# (SIGFPE). Now refused before any table is printed.
pagedkv_bad_input(memory.bytes_overflow_int64 STDOUT_EMPTY
  ARGS memory --kv-heads 65536 --head-dim 65536 --max-context 4294967296 --kv-memory 1GiB
       --no-measure
  REGEX "^pagedkv memory: growth table: [^\n]*overflows a 64-bit byte count\n$")

pagedkv_bad_input(replay.beam_width_zero STDOUT_EMPTY
  ARGS replay --trace ${_ok}/azure.csv --beam-width 2,0 --no-progress
  REGEX "--beam-width: Value 0 not in range 1 to 64")
pagedkv_bad_input(replay.parallel_samples_with_rates STDOUT_EMPTY
  ARGS replay --trace ${_ok}/azure.csv --parallel-samples 2 --rates 1,2 --no-progress
  REGEX "--rates excludes --parallel-samples")

pagedkv_bad_input(replay.sharing_unknown_mode STDOUT_EMPTY
  ARGS replay --trace ${_ok}/azure.csv --sharing greedy-3 --no-progress
  REGEX "^pagedkv replay: --sharing 'greedy-3': expected parallel-N or beam-N with N in \\[1, 64\\]")

# Positive controls: the valid traces replay and write their plot.
pagedkv_bad_input(replay.ok_control_azure EXPECTED 0
  ARGS replay --trace ${_ok}/azure.csv --strict --no-progress --svg ${_scratch}/ok_azure.svg
  OUT_FILE ${_scratch}/ok_azure.svg)
pagedkv_bad_input(replay.ok_control_mooncake EXPECTED 0
  ARGS replay --trace ${_ok}/mooncake.jsonl --strict --no-progress
       --svg ${_scratch}/ok_mooncake.svg
  OUT_FILE ${_scratch}/ok_mooncake.svg)

# ---- ops: scripts with unknown ops, wrong arities, bad sequence names, negative counts --------
if(EXISTS ${PROJECT_SOURCE_DIR}/src/cli/cmd_ops.cpp)
  # Parse errors: the whole script is parsed before anything runs, so stdout stays empty.
  set(_ops_parse_cases
    "unknown_op|line 3: unknown op 'allocate'"
    "binary_garbage|line 2: unknown op '.x00.x01.xfe.xff'"
    "control_bytes|line 2: unknown op '.x1b.31mred.x07'"
    "malformed_option|line 1: manager: malformed option 'blocks='"
    "duplicate_option|line 1: manager: option 'blocks' given twice"
    "positional_after_option|line 2: append: positional argument '1' after an option")
  foreach(_case IN LISTS _ops_parse_cases)
    pagedkv_split_case("${_case}" _name _what)
    pagedkv_bad_input(ops.${_name} STDOUT_EMPTY
      ARGS ops ${_bad}/ops/${_name}.txt
      REGEX "^pagedkv ops: ${_what}[^\n]*\n$")
  endforeach()
  # Run-time errors stop at the bad line (earlier lines' JSON results are already printed).
  set(_ops_run_cases
    "wrong_arity_fork|line 3: fork: expected PARENT CHILD, got 1 argument"
    "wrong_arity_free|line 4: free: expected SEQ, got 2 argument"
    "wrong_arity_manager|line 1: manager: expected only key=value options, got 1 argument"
    "unknown_sequence_name|line 2: add: sequence id must be an integer, got 'alice'"
    "unknown_sequence|line 3: free: [^\n]*unknown sequence 7"
    "negative_count|line 3: append: n must be in [[]0, [0-9]+[]], got -3"
    "negative_blocks|line 1: manager: blocks must be in [[]1, [0-9]+[]], got -4"
    "negative_sequence|line 2: add: sequence id must be in [[]0, [0-9]+[]], got -1"
    "negative_token|line 2: add: token id must be in [[]0, [0-9]+[]], got -6"
    "op_before_manager|line 2: add: no manager yet"
    "unknown_policy|line 1: manager: policy must be none, window, sinks or h2o, got 'lru'"
    "unknown_option|line 1: manager: unknown option 'colour'"
    "double_free|line 4: free: [^\n]*unknown sequence 1"
    "fork_existing_child|line 4: fork: [^\n]*sequence 2 already"
    "resume_not_preempted|line 3: resume: sequence 1 was not preempted"
    "score_without_h2o|line 4: score: [^\n]*"
    "huge_count|line 3: append: n must be an integer, got '99999999999999999999'"
    # Issue 16: hostile scripts stop at a documented limit (docs/ops-script.md#limits) before
    # anything is allocated for them (the driver caps the run's memory at 1 GiB).
    "append_2_pow_31|line 3: append: 2147483647 tokens exceed the limit of 65536 tokens per op"
    "lookahead_over_limit|line 3: can_append: 1000000 tokens exceed the limit of 65536 tokens"
    "chunk_over_limit|line 2: add: 65537 tokens exceed the limit of 65536 tokens per op"
    "batch_over_limit|line 3: batch_metadata: 65537 tokens exceed the limit of 65536 tokens"
    "fork_over_total|line 19: fork: 65536 more tokens would hold 1114112 in all, over the limit of 1048576 tokens per script"
    "preempt_over_total|line 34: fork: 65536 more tokens would hold 1114112 in all, over the limit of 1048576 tokens per script"
    "work_budget_managers|line 33: manager: needs 524288 work units, more than the [0-9]+ left of the script's budget [(]16777216 [+] 2 per script byte[)]"
    "control_bytes_in_value|line 1: manager: blocks must be an integer, got '4.x1b.2J'"
    "expect_error_succeeds|line 3: expect_error: free succeeded")
  foreach(_case IN LISTS _ops_run_cases)
    pagedkv_split_case("${_case}" _name _what)
    pagedkv_bad_input(ops.${_name}
      ARGS ops ${_bad}/ops/${_name}.txt
      REGEX "^pagedkv ops: ${_what}[^\n]*\n$")
  endforeach()
  pagedkv_bad_input(ops.missing_file STDOUT_EMPTY
    ARGS ops ${_bad}/ops/does_not_exist.txt
    REGEX "^pagedkv ops: [^\n]*does_not_exist.txt[^\n]*\n$")
  # Issue 16: non-regular files are refused by name; stdin is streamed with the line limit
  # enforced while reading, so /dev/zero stops after 1 MiB instead of filling memory.
  pagedkv_bad_input(ops.directory STDOUT_EMPTY
    ARGS ops ${_bad}/ops
    REGEX "^pagedkv ops: cannot read script '[^\n]*ops': is a directory\n$")
  pagedkv_bad_input(ops.dev_zero_by_name STDOUT_EMPTY
    ARGS ops /dev/zero
    REGEX "^pagedkv ops: cannot read script '/dev/zero': is a character device, not a regular file\n$")
  pagedkv_bad_input(ops.dev_zero_on_stdin STDOUT_EMPTY
    ARGS ops - INPUT /dev/zero
    REGEX "^pagedkv ops: line 1: line longer than 1048576 bytes\n$")
  pagedkv_bad_input(ops.ok_control EXPECTED 0 ARGS ops ${_ok}/ops.txt)
  pagedkv_bad_input(ops.ok_control_stdin EXPECTED 0 ARGS ops - INPUT ${_ok}/ops.txt)
endif()

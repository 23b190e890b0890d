# The libFuzzer targets and what each links, in one place: used by the clang fuzz build
# (tests/fuzz/CMakeLists.txt) and by the corpus replay tests of every build
# (tests/fuzz_corpus.cmake). A target whose layer is not built (no CLI: no model layer) is left
# out. Each target is tests/fuzz/<name>.cpp with its seed corpus in tests/fuzz/<name>/.
set(PAGEDKV_FUZZ_TARGETS fuzz_manager)
set(PAGEDKV_FUZZ_LIBS_fuzz_manager pagedkv::pagedkv)
if(TARGET pagedkv_sim)
  list(APPEND PAGEDKV_FUZZ_TARGETS fuzz_trace)
  set(PAGEDKV_FUZZ_LIBS_fuzz_trace pagedkv_sim)
endif()
if(TARGET pagedkv_model)
  list(APPEND PAGEDKV_FUZZ_TARGETS fuzz_checkpoint fuzz_tokenizer)
  set(PAGEDKV_FUZZ_LIBS_fuzz_checkpoint pagedkv_model)
  set(PAGEDKV_FUZZ_LIBS_fuzz_tokenizer pagedkv_model)
endif()
if(TARGET pagedkv_ops)
  list(APPEND PAGEDKV_FUZZ_TARGETS fuzz_ops)
  set(PAGEDKV_FUZZ_LIBS_fuzz_ops pagedkv_ops)
endif()

# Fuzz seed corpus as regression tests (issue 8): every fuzz target is also linked with a plain
# replay driver (tests/fuzz/replay_main.cpp, no libFuzzer needed, so gcc builds run it too) and
# run over its committed corpus tests/fuzz/<target>/. The ASan/UBSan job therefore replays the
# corpus under sanitizers on every CI run; scripts/ci-fuzz.sh does the actual fuzzing.
include(${CMAKE_CURRENT_SOURCE_DIR}/fuzz/targets.cmake)
foreach(name IN LISTS PAGEDKV_FUZZ_TARGETS)
  set(_corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name})
  if(NOT IS_DIRECTORY ${_corpus})
    continue()
  endif()
  add_executable(replay_${name} fuzz/${name}.cpp fuzz/replay_main.cpp)
  target_link_libraries(replay_${name} PRIVATE ${PAGEDKV_FUZZ_LIBS_${name}})
  target_include_directories(replay_${name} PRIVATE ${PROJECT_SOURCE_DIR}/src
                             ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
  add_test(NAME fuzz.${name}.corpus COMMAND replay_${name} ${_corpus})
  set_tests_properties(fuzz.${name}.corpus PROPERTIES LABELS fuzz_corpus TIMEOUT 300)
endforeach()

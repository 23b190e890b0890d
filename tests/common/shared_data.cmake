# pagedkv_add_shared_data_test(NAME <name> FILES <file>... COMMAND <cmd>... [PASS_REGEX <regex>])
#
# A test on data from ../shared (models, traces, reference outputs): with every FILES present it
# is the test COMMAND (passing when its output matches PASS_REGEX, if given); with any missing it is still registered, as a test that
# fails under CI=true naming the missing files (CI always provides ../shared: their absence there
# is a broken checkout) and is skipped with that reason elsewhere. So a missing file can never
# make a check silently disappear from the count. Callers set LABELS afterwards (on either form).
set(_pagedkv_missing_script ${CMAKE_CURRENT_LIST_DIR}/missing_shared_data.cmake)
function(pagedkv_add_shared_data_test)
  cmake_parse_arguments(PARSE_ARGV 0 A "" "NAME;PASS_REGEX" "FILES;COMMAND")
  set(_missing)
  foreach(_f IN LISTS A_FILES)
    if(NOT EXISTS ${_f})
      list(APPEND _missing ${_f})
    endif()
  endforeach()
  if(_missing)
    string(REPLACE ";" "|" _missing "${_missing}")
    add_test(NAME ${A_NAME}
      COMMAND ${CMAKE_COMMAND} "-DTEST=${A_NAME}" "-DMISSING=${_missing}"
              -P ${_pagedkv_missing_script})
    set_tests_properties(${A_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "pagedkv-skip: ")
  else()
    add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
    if(DEFINED A_PASS_REGEX)
      set_tests_properties(${A_NAME} PROPERTIES PASS_REGULAR_EXPRESSION "${A_PASS_REGEX}")
    endif()
  endif()
endfunction()

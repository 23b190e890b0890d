# Sanitizer canaries (issue 8), only in PAGEDKV_SANITIZE builds: a program that leaks and one
# with signed overflow must each be reported and fail. If the ASan job ever stops catching
# leaks or UB (options overridden, LSan disabled under ptrace), these fail instead of the
# suite passing silently.
if(NOT PAGEDKV_SANITIZE)
  return()
endif()
foreach(_canary leak ub)
  add_executable(sanitizer_canary_${_canary} ${CMAKE_CURRENT_SOURCE_DIR}/sanitizer_canary/${_canary}.cpp)
endforeach()
add_test(NAME sanitizer_canary.leak_is_reported
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:sanitizer_canary_leak>
          "-DREPORT=LeakSanitizer: detected memory leaks"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/sanitizer_canary/check.cmake)
add_test(NAME sanitizer_canary.ub_is_reported
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:sanitizer_canary_ub>
          "-DREPORT=runtime error: signed integer overflow"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/sanitizer_canary/check.cmake)
set_tests_properties(sanitizer_canary.leak_is_reported sanitizer_canary.ub_is_reported
  PROPERTIES LABELS sanitizer_canary)

# Property tests of the block manager (issue 4): rapidcheck (Debian librapidcheck-dev) with its
# GoogleTest integration. Files are tests/property/*_props.cpp, so the test_*.cpp glob of
# tests/CMakeLists.txt (gtest only) does not pick them up. Skipped when rapidcheck is absent.
find_package(rapidcheck QUIET)
if(NOT rapidcheck_FOUND)
  message(STATUS "pagedkv: rapidcheck not found, property tests disabled")
  return()
endif()
file(GLOB PAGEDKV_PROP_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/property/*_props.cpp)
foreach(src IN LISTS PAGEDKV_PROP_SOURCES)
  get_filename_component(name ${src} NAME_WE)
  set(name prop_${name})
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE pagedkv::pagedkv rapidcheck rapidcheck_gtest GTest::gtest
                                        GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  # A fixed seed keeps CI deterministic; RC_PARAMS in the environment overrides it
  # (e.g. RC_PARAMS="seed=123 max_success=1000" for a longer local run).
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES
    PROPERTIES LABELS "unit;property" ENVIRONMENT "RC_PARAMS=seed=20240601 max_success=500")
endforeach()

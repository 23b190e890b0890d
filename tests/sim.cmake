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
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR}/sim)
  target_compile_definitions(${name} PRIVATE PAGEDKV_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
  if(TARGET pagedkv_sim_model)
    target_link_libraries(${name} PRIVATE pagedkv_sim_model)
    target_compile_definitions(${name} PRIVATE PAGEDKV_HAVE_MODEL=1)
  else()
    target_compile_definitions(${name} PRIVATE PAGEDKV_HAVE_MODEL=0)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "unit;sim")
endforeach()

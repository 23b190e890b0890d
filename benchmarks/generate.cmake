# End-to-end generation benchmark (issue 7): needs the model layer, which exists only when the
# CLI/model targets are built (PAGEDKV_BUILD_CLI). Not a bench_*.cpp, so the glob in
# benchmarks/CMakeLists.txt does not build it without the model. The marker file tells
# benchmarks/run.sh whether this build has it.
set(_marker ${CMAKE_CURRENT_BINARY_DIR}/bench_generate.enabled)
if(TARGET pagedkv_model)
  add_executable(bench_generate ${CMAKE_CURRENT_SOURCE_DIR}/generate_e2e.cpp)
  target_link_libraries(bench_generate PRIVATE pagedkv_model pagedkv::pagedkv benchmark::benchmark)
  target_include_directories(bench_generate PRIVATE ${PROJECT_SOURCE_DIR}/src)
  file(TOUCH ${_marker})
else()
  file(REMOVE ${_marker})
endif()

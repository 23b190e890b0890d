# bench_replay (issue 6): benchmarks/CMakeLists.txt makes one executable per bench_*.cpp linked
# to pagedkv only; the replay simulation lives in pagedkv_sim and reads ../shared/traces.
if(TARGET bench_replay AND TARGET pagedkv_sim)
  target_link_libraries(bench_replay PRIVATE pagedkv_sim)
  target_compile_definitions(bench_replay PRIVATE
    PAGEDKV_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
endif()

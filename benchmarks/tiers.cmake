# bench_tiers uses the tiers library (src/tiers) besides pagedkv.
if(TARGET bench_tiers AND TARGET pagedkv_tiers)
  target_link_libraries(bench_tiers PRIVATE pagedkv_tiers)
endif()

# Tiers below the pool (issue 18, docs/tiers.md): one executable per test file of tests/tiers,
# linked against pagedkv::tiers. Tests that need a Redis server start their own
# `redis-server` on 127.0.0.1 at a free port (tests/tiers/redis_server.hpp) and skip with a
# printed reason when it is not installed, except under CI=true, where that is a failure.
if(NOT TARGET pagedkv_tiers)
  return()
endif()
file(GLOB _tier_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/tiers/test_*.cpp)
foreach(src IN LISTS _tier_tests)
  get_filename_component(name ${src} NAME_WE)
  add_executable(tiers_${name} ${src})
  target_link_libraries(tiers_${name} PRIVATE pagedkv_tiers pagedkv::pagedkv GTest::gtest
                                              GTest::gtest_main GTest::gmock)
  target_include_directories(tiers_${name} PRIVATE ${PROJECT_SOURCE_DIR}/src
                                                   ${CMAKE_CURRENT_SOURCE_DIR})
  gtest_discover_tests(tiers_${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES PROPERTIES LABELS tiers)
endforeach()

# Item 5: two `pagedkv generate` processes sharing KV through a disk-tier file and a real
# redis-server (started by the script on a free loopback port), with the fault cases.
if(TARGET pagedkv_cli)
  add_test(NAME tiers.two_instances
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tiers/two_instances.sh
                   $<TARGET_FILE:pagedkv_cli> ${CMAKE_CURRENT_BINARY_DIR}/tiers_two_instances)
  set_tests_properties(tiers.two_instances PROPERTIES LABELS "tiers;cli" TIMEOUT 300
                       SKIP_RETURN_CODE 77)
endif()

# --warm-pass (docs/tiers.md, "From pagedkv generate"): the real model's prompts run once, the
# pool's prefix cache is dropped to a host tier, and the measured run onboards the full blocks
# of every prompt from it (32 of the 55 prompt tokens of tests/model/prompts.txt at block size
# 16: the two prompts over 16 tokens) and still agrees with the contiguous reference.
if(TARGET pagedkv_cli)
  add_test(NAME cli.generate.warm_pass_tiers
           COMMAND pagedkv_cli generate --steps 60 --cache all --tier-host-mib 8
                   --warm-pass tiers --prompts ${CMAKE_CURRENT_SOURCE_DIR}/model/prompts.txt)
  set_tests_properties(cli.generate.warm_pass_tiers PROPERTIES LABELS "tiers;cli"
    PASS_REGULAR_EXPRESSION "agreement: contiguous vs paged: same tokens.*warm pass [(]tiers[)][^\n]*\nprefix cache [(]paged[)]: 32 of 55 prompt tokens not prefilled [(]0 hit in the pool, 32 onboarded from the tiers[)]")
  add_test(NAME cli.generate.warm_pass_tiers_needs_a_tier
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:pagedkv_cli> -DEXPECTED=2
            "-DARGS=generate|--steps|60|--cache|paged|--prefix-caching|--warm-pass|tiers"
            "-DSTDERR_REGEX=warm pass 'tiers' needs a tier"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/model/expect_exit.cmake)
  set_tests_properties(cli.generate.warm_pass_tiers_needs_a_tier PROPERTIES LABELS "tiers;cli")
endif()

# Installs this build into a scratch prefix, then configures, builds and runs tests/consumer
# against it with find_package(pagedkv): the packaging contract, checked end to end.
set(_prefix ${CMAKE_BINARY_DIR}/consumer-install)
set(_build ${CMAKE_BINARY_DIR}/consumer-build)
add_test(NAME package.install
  COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --prefix ${_prefix})
add_test(NAME package.configure_consumer
  COMMAND ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_SOURCE_DIR}/consumer -B ${_build}
          -DCMAKE_PREFIX_PATH=${_prefix} -DCMAKE_BUILD_TYPE=Release)
add_test(NAME package.build_consumer COMMAND ${CMAKE_COMMAND} --build ${_build})
add_test(NAME package.run_consumer COMMAND ${_build}/consumer)
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP pkg_installed)
set_tests_properties(package.configure_consumer PROPERTIES
  FIXTURES_REQUIRED pkg_installed FIXTURES_SETUP pkg_configured)
set_tests_properties(package.build_consumer PROPERTIES
  FIXTURES_REQUIRED pkg_configured FIXTURES_SETUP pkg_built)
set_tests_properties(package.run_consumer PROPERTIES FIXTURES_REQUIRED pkg_built
  PASS_REGULAR_EXPRESSION "consumer: paged")

# The packaging contract, end to end (docs/packaging.md): install pagedkv into a scratch prefix,
# then configure, build and run tests/consumer against it with find_package(pagedkv), both ways:
#   package.<this build's type>.*   installs this build;
#   package.<the other type>.*      first builds and installs the library alone the other way
#                                   (CPU only; no tests, benchmarks or CLI, to keep CI short).
# A consumer of the shared library is configured with fmt, Highway, OpenMP, pkg-config and CUDA
# disabled (CMAKE_DISABLE_FIND_PACKAGE_*) and its binary may need libpagedkv alone: neither its
# package config nor its link line may ask for pagedkv's private dependencies.
if(BUILD_SHARED_LIBS)
  set(_this shared)
  set(_other static)
  set(_other_shared OFF)
else()
  set(_this static)
  set(_other shared)
  set(_other_shared ON)
endif()

# pagedkv_package_consumer(<type> <prefix> <fixture the install sets up>)
function(pagedkv_package_consumer type prefix installed)
  set(_build ${CMAKE_BINARY_DIR}/package-${type}/consumer-build)
  set(_no_deps)
  if(type STREQUAL "shared")
    foreach(_pkg fmt hwy OpenMP PkgConfig CUDAToolkit)
      list(APPEND _no_deps -DCMAKE_DISABLE_FIND_PACKAGE_${_pkg}=ON)
    endforeach()
  endif()
  add_test(NAME package.${type}.configure_consumer
    COMMAND ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_SOURCE_DIR}/consumer -B ${_build}
            -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} ${_no_deps})
  add_test(NAME package.${type}.build_consumer COMMAND ${CMAKE_COMMAND} --build ${_build})
  add_test(NAME package.${type}.run_consumer
    COMMAND ${CMAKE_COMMAND} -DEXE=${_build}/consumer -DTYPE=${type}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_consumer.cmake)
  set_tests_properties(package.${type}.configure_consumer PROPERTIES
    FIXTURES_REQUIRED ${installed} FIXTURES_SETUP pkg_${type}_configured)
  set_tests_properties(package.${type}.build_consumer PROPERTIES
    FIXTURES_REQUIRED pkg_${type}_configured FIXTURES_SETUP pkg_${type}_built)
  set_tests_properties(package.${type}.run_consumer PROPERTIES FIXTURES_REQUIRED pkg_${type}_built)
  set_tests_properties(package.${type}.configure_consumer package.${type}.build_consumer
    package.${type}.run_consumer PROPERTIES LABELS package)
endfunction()

# ---- this build ---------------------------------------------------------------------------------
set(_prefix ${CMAKE_BINARY_DIR}/package-${_this}/install)
add_test(NAME package.${_this}.install
  COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --prefix ${_prefix})
set_tests_properties(package.${_this}.install PROPERTIES FIXTURES_SETUP pkg_${_this}_installed
  LABELS package)
pagedkv_package_consumer(${_this} ${_prefix} pkg_${_this}_installed)
if(TARGET pagedkv_cli)
  # The installed CLI finds its default model in share/pagedkv/models beside bin/.
  add_test(NAME package.${_this}.installed_cli_default_model
    COMMAND ${_prefix}/${CMAKE_INSTALL_BINDIR}/pagedkv generate --steps 24 --cache paged)
  set_tests_properties(package.${_this}.installed_cli_default_model PROPERTIES
    FIXTURES_REQUIRED pkg_${_this}_installed LABELS package
    PASS_REGULAR_EXPRESSION "^model: ${_prefix}/${CMAKE_INSTALL_DATADIR}/pagedkv/models/stories260K.bin [^\n]*\n.*\nOnce upon a time, ")
endif()

# ---- the other type: the library alone, built and installed by the test --------------------------
set(_other_dir ${CMAKE_BINARY_DIR}/package-${_other})
set(_launcher)
if(CMAKE_CXX_COMPILER_LAUNCHER)
  set(_launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
add_test(NAME package.${_other}.configure_library
  COMMAND ${CMAKE_COMMAND} -S ${PROJECT_SOURCE_DIR} -B ${_other_dir}/build
          -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} ${_launcher}
          -DBUILD_SHARED_LIBS=${_other_shared} -DPAGEDKV_ENABLE_CUDA=OFF
          -DPAGEDKV_BUILD_TESTS=OFF -DPAGEDKV_BUILD_BENCHMARKS=OFF -DPAGEDKV_BUILD_CLI=OFF
          -DPAGEDKV_BUILD_PYTHON=OFF)
add_test(NAME package.${_other}.build_library
  COMMAND ${CMAKE_COMMAND} --build ${_other_dir}/build --parallel 2)
add_test(NAME package.${_other}.install
  COMMAND ${CMAKE_COMMAND} --install ${_other_dir}/build --prefix ${_other_dir}/install)
set_tests_properties(package.${_other}.configure_library PROPERTIES
  FIXTURES_SETUP pkg_${_other}_library_configured)
set_tests_properties(package.${_other}.build_library PROPERTIES PROCESSORS 2 TIMEOUT 1200
  FIXTURES_REQUIRED pkg_${_other}_library_configured FIXTURES_SETUP pkg_${_other}_library_built)
set_tests_properties(package.${_other}.install PROPERTIES
  FIXTURES_REQUIRED pkg_${_other}_library_built FIXTURES_SETUP pkg_${_other}_installed)
set_tests_properties(package.${_other}.configure_library package.${_other}.build_library
  package.${_other}.install PROPERTIES LABELS package)
pagedkv_package_consumer(${_other} ${_other_dir}/install pkg_${_other}_installed)

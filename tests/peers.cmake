# benchmarks/gpu_peers.py (the CUDA decode's peers, issue 22 item 8) on the CPU with small shapes:
# the paged baseline (page-table gather + attention) agrees with attention on contiguous K/V at
# page sizes 1, 16 and 128, a bench_cuda_decode JSON joins by shape (a file matching no shape is
# an error), and the tables print. Runs with Debian's interpreter and its python3-torch
# (scripts/python-setup.sh installs it in CI); exit 77, skipped with the reason, where that torch
# is missing.
find_program(PAGEDKV_DEBIAN_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(PAGEDKV_DEBIAN_PYTHON)
  add_test(NAME benchmarks.gpu_peers_cpu_smoke
    COMMAND ${PAGEDKV_DEBIAN_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/gpu_peers.py --device cpu
            --small --ours ${CMAKE_CURRENT_SOURCE_DIR}/data/bench_cuda_decode_sample.json)
  set_tests_properties(benchmarks.gpu_peers_cpu_smoke PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
endif()

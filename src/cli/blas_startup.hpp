#pragma once
// OpenBLAS's worker threads, created only when a matrix product needs them.
//
// OpenBLAS (Debian's pthreads build) reads its thread count in its load-time constructor and
// starts that many - 1 workers there; each then spin-waits in sched_yield for up to 2^28 TSC
// ticks (~0.1 s here) before it sleeps, whether or not a product ever comes. A stories260K run
// never gives them one (model::MatmulThreads keeps small products on one thread), yet the idle
// worker took 20-35 ms of CPU in about half of the `pagedkv generate` processes of ~45 ms, on the
// main thread's core as often as not: those runs' decode steps took twice as long
// (docs/benchmarks.md, 2026-12-05).
//
// The only switch OpenBLAS reads that early is the environment, and the environment cannot be
// changed before the libraries' constructors from inside the process (libc installs the
// environment it was started with after .preinit_array functions run). So, when the user set none
// of OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS and OMP_NUM_THREADS, a .preinit_array function (ELF
// gABI DT_PREINIT_ARRAY: before any shared library's constructor, so before OpenBLAS, Highway or
// the CUDA runtime initialize) re-executes /proc/self/exe with OPENBLAS_NUM_THREADS=1 and a
// marker added; in the new image an ordinary constructor of the executable (after the
// libraries') removes both again, so the commands see the user's environment. Cost: one more
// exec and dynamic link, about 1-2 ms. The commands that run the model then give LlamaModel
// matmul_max_threads() as MatmulThreads::max_threads: a product big enough raises OpenBLAS's
// count and openblas_set_num_threads creates the workers then, as its default would have.
// Anything failing (no /proc, execve refused) leaves OpenBLAS's default start.

#include <cstdint>

namespace pagedkv::cli {

/// True when this process's OpenBLAS was started with one thread by the re-execution above.
[[nodiscard]] bool blas_start_deferred();

/// Threads for the matrix products big enough to split (MatmulThreads::max_threads): the cores
/// (std::thread::hardware_concurrency) when the start was deferred, otherwise what BLAS runs on
/// now (model::blas_threads: OPENBLAS_NUM_THREADS or OpenBLAS's default).
[[nodiscard]] int32_t matmul_max_threads();

}  // namespace pagedkv::cli

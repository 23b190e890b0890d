// Tests for src/model/llama.hpp's thread policy (MatmulThreads): which BLAS thread count each
// matrix product of forward() runs on, and that the policy changes no result. The forward pass
// itself is tested against the reference runtime (test_llama_reference.cpp) and across the cache
// modes (test_generate.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/checkpoint.hpp"
#include "model/kv_backend.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "tiny_llama.hpp"

namespace pagedkv::model {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

/// Restores OpenBLAS's thread count (process-wide) after a test that changes it.
class BlasThreadsGuard {
 public:
  BlasThreadsGuard() : saved_(blas_threads()) {}
  ~BlasThreadsGuard() { set_threads(saved_, 0); }
  BlasThreadsGuard(const BlasThreadsGuard&) = delete;
  BlasThreadsGuard& operator=(const BlasThreadsGuard&) = delete;

 private:
  int32_t saved_;
};

/// True when the BLAS lets pagedkv set its thread count (OpenBLAS).
bool blas_has_threads() {
  BlasThreadsGuard guard;
  set_threads(2, 0);
  return blas_threads() == 2;
}

/// Logits of a prefill of 5 tokens, then of 3 decode steps, on a fresh paged cache.
std::vector<float> run_steps(LlamaModel& model) {
  auto backend = make_kv_backend(CacheMode::kPaged, model.backend_config(16, 4));
  backend->add_sequence(0);
  const SeqId seq = 0;
  std::vector<float> out;
  std::vector<TokenId> tokens = {kBos, 11, 12, 13, 14};
  for (int step = 0; step < 4; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const auto logits = model.forward(*backend, {{&seq, 1}, {&n, 1}, tokens}, false);
    out.insert(out.end(), logits.begin(), logits.end());
    tokens = {static_cast<TokenId>(20 + step)};
  }
  return out;
}

TEST(MatmulThreads, ANewModelLeavesTheBlasThreadCountAlone) {
  if (!blas_has_threads()) GTEST_SKIP() << "this BLAS has no thread count to set";
  BlasThreadsGuard guard;
  LlamaModel model(random_weights(testing::tiny_llama_config(), 3));
  EXPECT_EQ(model.matmul_threads().max_threads, 0);
  set_threads(2, 0);
  (void)run_steps(model);
  EXPECT_EQ(blas_threads(), 2);
}

TEST(MatmulThreads, SmallProductsRunOnOneThreadLargeOnesOnMax) {
  if (!blas_has_threads()) GTEST_SKIP() << "this BLAS has no thread count to set";
  BlasThreadsGuard guard;
  LlamaModel model(random_weights(testing::tiny_llama_config(), 3));
  // The tiny model's largest product: 5 rows x 300 (classifier) x 32 = 48000 multiply-adds.
  set_threads(2, 0);
  model.set_matmul_threads({.max_threads = 2});  // default threshold 4 M: every product is small
  (void)run_steps(model);
  EXPECT_EQ(blas_threads(), 1);

  // Threshold 0: every product is large enough.
  model.set_matmul_threads({.max_threads = 2, .min_parallel_macs = 0});
  (void)run_steps(model);
  EXPECT_EQ(blas_threads(), 2);

  // Threshold between a decode step's classifier (1 x 300 x 32 = 9600) and the wk product of the
  // 5-token prefill (5 x 32 x 32 = 5120): the last product, the decode classifier, is large.
  model.set_matmul_threads({.max_threads = 2, .min_parallel_macs = 9600});
  (void)run_steps(model);
  EXPECT_EQ(blas_threads(), 2);
  model.set_matmul_threads({.max_threads = 2, .min_parallel_macs = 9601});
  (void)run_steps(model);
  EXPECT_EQ(blas_threads(), 1);
}

TEST(MatmulThreads, ThePolicyChangesNoLogit) {
  BlasThreadsGuard guard;
  LlamaModel model(random_weights(testing::tiny_llama_config(), 3));
  model.set_matmul_threads({.max_threads = 1});
  const std::vector<float> one = run_steps(model);
  model.set_matmul_threads({.max_threads = 2, .min_parallel_macs = 0});
  const std::vector<float> split = run_steps(model);
  ASSERT_EQ(one.size(), split.size());
  ASSERT_EQ(one.size(), size_t{4} * 300);
  for (size_t i = 0; i < one.size(); ++i) {
    // A split product sums each output in the same order; allow fp32 noise all the same.
    EXPECT_NEAR(one[i], split[i], 1e-5f) << "logit " << i;
  }
}

TEST(MatmulThreads, RejectsNegativeSettings) {
  LlamaModel model(random_weights(testing::tiny_llama_config(), 3));
  EXPECT_THAT([&] { model.set_matmul_threads({.max_threads = -1}); },
              ThrowsMessage<Error>(HasSubstr("max_threads -1")));
  EXPECT_THAT([&] { model.set_matmul_threads({.max_threads = 2, .min_parallel_macs = -5}); },
              ThrowsMessage<Error>(HasSubstr("min_parallel_macs -5")));
  EXPECT_EQ(model.matmul_threads().max_threads, 0);  // unchanged by a rejected setting
}

}  // namespace
}  // namespace pagedkv::model

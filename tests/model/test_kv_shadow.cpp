// Tests for model::ShadowKVBackend (src/model/kv_shadow.hpp), the teacher-forced storage error
// of `pagedkv generate --kv-nmse`: a one-key attention whose output is the stored value itself,
// so the NMSE of a 16-bit shadow is worked out here from an independent rounding; an fp32 shadow
// measures exactly zero; on random K/V the formats rank by their mantissa bits; the primary's
// outputs are those of a plain backend; bad arguments throw.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/kv_shadow.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::model {
namespace {

KVBackendConfig geometry(int32_t heads, int32_t kv_heads, int32_t dim) {
  KVBackendConfig c;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = dim;
  c.block_size = 4;
  c.num_blocks = 64;
  return c;
}

/// bf16 by round to nearest even on the fp32 bits (finite inputs), written independently of
/// pagedkv's dtype.hpp.
float to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xFFFF0000u);
}

/// One step of `n` tokens of one sequence through every layer; returns the primary's outputs.
std::vector<float> step(KVBackend& b, const KVBackendConfig& c, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto rows = static_cast<size_t>(n);
  std::vector<float> q(rows * static_cast<size_t>(c.num_heads * c.head_dim));
  std::vector<float> k(rows * static_cast<size_t>(c.num_kv_heads * c.head_dim)), v(k.size());
  std::vector<float> out(q.size()), all;
  const SeqId seq = 0;
  const int64_t n_new = n;
  b.begin_step({&seq, 1}, {&n_new, 1});
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    for (float& x : q) x = u(rng);
    for (float& x : k) x = u(rng);
    for (float& x : v) x = u(rng);
    b.attend(layer, q, k, v, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  b.end_step();
  return all;
}

TEST(ShadowKVBackend, OneKeyGivesTheStoredValueSoTheNmseIsTheRoundingOfV) {
  const KVBackendConfig c = geometry(1, 1, 4);
  ShadowKVBackend b(make_kv_backend(CacheMode::kPaged, c), c, {DType::kBF16, DType::kF32});
  b.add_sequence(0);
  const SeqId seq = 0;
  const int64_t one = 1;
  b.begin_step({&seq, 1}, {&one, 1});
  // Values with bits below bf16's 7-bit mantissa: 1 + 3 * 2^-9 rounds up to 1 + 2^-7 (error
  // 2^-9), 0.3 and -2.7 round to their nearest bf16, 0.5 is exact.
  const std::vector<float> q = {0.1f, 0.2f, 0.3f, 0.4f}, k = {1, 2, 3, 4};
  const std::vector<float> v = {1.0f + 3.0f / 512.0f, 0.3f, -2.7f, 0.5f};
  double sq_err = 0, sq_ref = 0, max_err = 0;
  for (float x : v) {
    const double e = static_cast<double>(to_bf16(x)) - x;
    sq_err += e * e;
    sq_ref += static_cast<double>(x) * x;
    max_err = std::max(max_err, std::abs(e));
  }
  std::vector<float> out(4);
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    b.attend(layer, q, k, v, out);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(out[i], v[i]);  // the primary: fp32
  }
  b.end_step();
  ASSERT_EQ(b.errors().size(), 2u);
  const ShadowError& bf16 = b.errors()[0];
  EXPECT_EQ(bf16.dtype, DType::kBF16);
  EXPECT_EQ(bf16.elements, 8);  // 4 outputs x 2 layers
  EXPECT_NEAR(bf16.sum_sq_error, 2 * sq_err, 1e-12);
  EXPECT_NEAR(bf16.sum_sq_reference, 2 * sq_ref, 1e-9);
  EXPECT_NEAR(bf16.nmse(), sq_err / sq_ref, 1e-9);
  EXPECT_NEAR(bf16.max_abs_error, max_err, 1e-9);
  EXPECT_GT(bf16.nmse(), 0.0);
  const ShadowError& f32 = b.errors()[1];
  EXPECT_EQ(f32.nmse(), 0.0);
  EXPECT_EQ(f32.max_abs_error, 0.0);
}

TEST(ShadowKVBackend, FormatsRankByPrecisionOnRandomKV) {
  const KVBackendConfig c = geometry(4, 2, 16);
  const std::vector<DType> dtypes = {DType::kF16, DType::kBF16, DType::kInt8, DType::kFP8E4M3,
                                     DType::kFP8E5M2};
  ShadowKVBackend b(make_kv_backend(CacheMode::kPaged, c), c, dtypes);
  auto plain = make_kv_backend(CacheMode::kPaged, c);
  b.add_sequence(0);
  plain->add_sequence(0);
  std::mt19937 rng_a(7), rng_b(7);
  // A prefill of 40 tokens (the 8-bit shadows calibrate on it), then 10 decode steps.
  for (int64_t n : {40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    const std::vector<float> got = step(b, c, n, rng_a);
    EXPECT_EQ(got, step(*plain, c, n, rng_b));  // the model reads the primary, untouched
  }
  EXPECT_EQ(b.num_tokens(0), 50);
  const auto& e = b.errors();
  ASSERT_EQ(e.size(), dtypes.size());
  for (const ShadowError& x : e) EXPECT_GT(x.nmse(), 0.0) << dtype_name(x.dtype);
  // fp16 (10 mantissa bits) < bf16 (7) < int8 on uniform data (step max/127) < e4m3 (3) < e5m2 (2).
  EXPECT_LT(e[0].nmse(), e[1].nmse());
  EXPECT_LT(e[1].nmse(), e[2].nmse());
  EXPECT_LT(e[2].nmse(), e[3].nmse());
  EXPECT_LT(e[3].nmse(), e[4].nmse());
  b.free_sequence(0);  // every cache frees it: adding it again succeeds everywhere
  b.add_sequence(0);
  EXPECT_EQ(b.num_tokens(0), 0);
}

TEST(ShadowKVBackend, RejectsANullPrimaryAndARepeatedDType) {
  const KVBackendConfig c = geometry(1, 1, 4);
  EXPECT_THROW(ShadowKVBackend(nullptr, c, {DType::kBF16}), Error);
  try {
    ShadowKVBackend b(make_kv_backend(CacheMode::kPaged, c), c, {DType::kInt8, DType::kInt8});
    FAIL() << "a repeated dtype was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("int8 given twice"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace pagedkv::model

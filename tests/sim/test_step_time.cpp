// Tests for src/sim/step_time.hpp and hardware_preset.hpp: the roofline step time on
// hand-computed steps (a one-sequence decode where the bandwidth term dominates, a prefill
// chunk where the FLOPs term does), the work accounting of a chunk, the presets, bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "sim/hardware_preset.hpp"
#include "sim/model_preset.hpp"
#include "sim/step_time.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Positions [3, 5): queries 3 and 4 attend 4 and 5 keys (causal), and the chunk reads 5
// positions' K/V and writes 2.
TEST(StepTime, WorkOfAChunk) {
  StepWork w;
  w.add(3, 2);
  EXPECT_EQ(w.tokens, 2);
  EXPECT_EQ(w.kv_read, 5);
  EXPECT_EQ(w.attention_pairs, 4 + 5);
  w.add(10, 1);  // a decode at context 10: reads 11 positions, 11 pairs
  EXPECT_EQ(w.tokens, 3);
  EXPECT_EQ(w.kv_read, 16);
  EXPECT_EQ(w.attention_pairs, 9 + 11);
  w.add(50, 0);  // nothing computed: nothing read either
  EXPECT_EQ(w.kv_read, 16);
}

// The Llama-3-8B preset on an H200 with the default efficiencies (0.5, 0.5) and 1 ms overhead.
RooflineModel llama3_h200() {
  const ModelPreset& m = find_preset("llama-3-8b");
  return make_roofline(m, kv_bytes_per_token(m), find_hardware("h200"));
}

TEST(StepTime, ModelConstantsFromThePresets) {
  const RooflineModel r = llama3_h200();
  EXPECT_DOUBLE_EQ(r.weight_bytes, 8030261248.0 * 2);
  EXPECT_DOUBLE_EQ(r.flops_per_token, 8030261248.0 * 2);
  EXPECT_DOUBLE_EQ(r.kv_bytes_per_token, 2.0 * 32 * 8 * 128 * 2);  // GQA: 8 kv heads, bf16
  EXPECT_DOUBLE_EQ(r.flops_per_pair, 4.0 * 32 * 32 * 128);         // 32 query heads
  EXPECT_DOUBLE_EQ(r.bandwidth_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(r.flops_per_s, 989e12);
}

// One sequence decoding at context 1000: reads 1001 positions, writes 1. Bandwidth-bound:
//   bytes = 16,060,522,496 + 131,072 x 1,002 = 16,191,856,640 -> / 2.4e12 B/s = 6.74661 ms
//   flops = 16,060,522,496 + 524,288 x 1,001 = 16,585,334,784 -> / 494.5e12 = 0.03354 ms
TEST(StepTime, OneSequenceDecodeIsBandwidthBound) {
  StepWork w;
  w.add(1000, 1);
  const StepTime t = step_time(llama3_h200(), w);
  EXPECT_NEAR(t.memory_ms, 16191856640.0 / 2.4e12 * 1000, 1e-9);
  EXPECT_NEAR(t.memory_ms, 6.746607, 1e-6);
  EXPECT_NEAR(t.compute_ms, 16585334784.0 / 494.5e12 * 1000, 1e-12);
  EXPECT_NEAR(t.total_ms, 1.0 + 6.746607, 1e-6);
}

// A 4096-token prefill chunk from position 0: 4096 x 4097 / 2 = 8,390,656 pairs.
//   flops = 16,060,522,496 x 4,096 + 524,288 x 8,390,656 = 7.0183e13 -> / 494.5e12 = 141.93 ms
//   bytes = 16,060,522,496 + 131,072 x 8,192 = 17,134,264,320 -> 7.139 ms: compute-bound.
TEST(StepTime, PrefillChunkIsComputeBound) {
  StepWork w;
  w.add(0, 4096);
  const StepTime t = step_time(llama3_h200(), w);
  const double flops = 16060522496.0 * 4096 + 524288.0 * 8390656;
  EXPECT_NEAR(t.compute_ms, flops / 494.5e12 * 1000, 1e-9);
  EXPECT_NEAR(t.compute_ms, 141.93, 0.01);
  EXPECT_NEAR(t.memory_ms, 17134264320.0 / 2.4e12 * 1000, 1e-9);
  EXPECT_DOUBLE_EQ(t.total_ms, 1.0 + t.compute_ms);
}

// Where the terms cross for a batch of decodes at context 0 (each reads its own position):
// bytes W + 2 kv T vs flops (2N + 4 L H D) T. W = 2N bytes, so the cross-over is near
// T = (F eff) / (BW eff) = 494.5e12 / 2.4e12 = 206 tokens. Checked on both sides of it.
TEST(StepTime, DecodeBatchCrossesOverNearTheRidgePoint) {
  const RooflineModel r = llama3_h200();
  StepWork small;
  StepWork large;
  for (int i = 0; i < 190; ++i) small.add(0, 1);
  for (int i = 0; i < 220; ++i) large.add(0, 1);
  EXPECT_GT(step_time(r, small).memory_ms, step_time(r, small).compute_ms);
  EXPECT_LT(step_time(r, large).memory_ms, step_time(r, large).compute_ms);
}

TEST(StepTime, BadModelsThrowNamingTheValue) {
  RooflineModel r = llama3_h200();
  r.bandwidth_efficiency = 0;
  EXPECT_THAT([&] { validate(r); },
              ThrowsMessage<Error>(HasSubstr("bandwidth efficiency must be in (0, 1], got 0")));
  r = llama3_h200();
  r.overhead_ms = -1;
  EXPECT_THAT([&] { validate(r); }, ThrowsMessage<Error>(HasSubstr("got -1")));
  const ModelPreset& builtin = find_preset("builtin");
  EXPECT_THAT([&] { (void)make_roofline(builtin, 1, find_hardware("h200")); },
              ThrowsMessage<Error>(HasSubstr("model 'builtin' has no parameter count")));
  EXPECT_THAT(
      [&] { (void)make_roofline(find_preset("opt-13b"), 1, find_hardware("a100-40gb"), 1.5); },
      ThrowsMessage<Error>(HasSubstr("got 1.5")));
}

TEST(HardwarePreset, DatasheetFiguresAndLookup) {
  ASSERT_EQ(hardware_presets().size(), 4u);
  EXPECT_DOUBLE_EQ(find_hardware("A100_40GB").bandwidth_bytes_per_s, 1555e9);
  EXPECT_DOUBLE_EQ(find_hardware("a100-80gb").bandwidth_bytes_per_s, 2039e9);
  EXPECT_DOUBLE_EQ(find_hardware("h100-sxm").bf16_flops_per_s, 989e12);
  EXPECT_DOUBLE_EQ(find_hardware("h200").memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(host_link_bandwidth("pcie4"), 25e9);
  EXPECT_DOUBLE_EQ(host_link_bandwidth("PCIe5"), 50e9);
  EXPECT_THAT([] { (void)find_hardware("tpu"); },
              ThrowsMessage<Error>(HasSubstr("unknown hardware preset 'tpu' (known: a100-40gb")));
  EXPECT_THAT([] { (void)host_link_bandwidth("nvlink"); },
              ThrowsMessage<Error>(HasSubstr("unknown host link 'nvlink'")));
}

// OPT-13B (the vLLM paper's model): 2 x 40 x 40 x 128 x 2 = 800 KiB per token; on an A100-40GB
// its 12.85e9 fp16 parameters take 25.7 GB, leaving about 12 GB for KV as the paper says.
TEST(ModelPresetOpt, Opt13bGeometry) {
  const ModelPreset& m = find_preset("opt-13b");
  EXPECT_EQ(kv_bytes_per_token(m), 819200);
  EXPECT_EQ(m.max_context, 2048);
  const double left = find_hardware("a100-40gb").memory_bytes - 2.0 * m.num_params;
  EXPECT_NEAR(left / 1e9, 14.3, 0.1);  // minus activations and workspace: ~12 GB in the paper
}

}  // namespace
}  // namespace pagedkv::sim

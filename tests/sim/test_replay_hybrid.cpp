// Tests for the replay's hybrid-<bs> strategy (src/sim/replay.hpp, replay_hybrid.cpp) and its
// page-size rule (src/sim/hybrid_layout.hpp): the layouts of the presets, a hand-worked trace
// where the hybrid pool runs more requests at once than paged, exact equality with paged-16
// on a model without local layers, the refused options, and invariants on a real trace.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "sim/hybrid_layout.hpp"
#include "sim/model_preset.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::make_trace;

constexpr Strategy kHybrid16{StrategyKind::kHybrid, 16};
constexpr Strategy kPaged16{StrategyKind::kPaged, 16};

// ---- the page-size rule ------------------------------------------------------------------------

// Gemma-3-27B: 10 full + 52 window layers -> G = 10 (52 >= 1.5 x 10), 1 + 6 groups, 70 slots,
// 8 padded; 2 x 16 x 128 x 2 = 8192 bytes per layer-position, pages 16 x 10 x 8192 bytes.
TEST(HybridLayout, Gemma3PadsTheWindowGroups) {
  const HybridLayout l = hybrid_layout(find_preset("gemma-3-27b"), 16);
  EXPECT_EQ(l.layers_per_group, 10);
  EXPECT_EQ(l.full_groups, 1);
  EXPECT_EQ(l.local_groups, 6);
  EXPECT_EQ(l.padded_layers, 8);
  EXPECT_EQ(l.layer_position_bytes, 8192);
  EXPECT_EQ(l.page_bytes, 1310720);
  ASSERT_EQ(l.groups.size(), 7u);
  EXPECT_EQ(l.groups[0].kind, GroupAttention::kFull);
  for (size_t g = 1; g < 7; ++g) {
    EXPECT_EQ(l.groups[g].kind, GroupAttention::kSlidingWindow);
    EXPECT_EQ(l.groups[g].window, 1024);
    EXPECT_EQ(l.groups[g].num_layers, g < 6 ? 10 : 2);  // 52 = 5 x 10 + 2 real layers
  }
}

// Equal kinds (gpt-oss 18 + 18, 12 + 12) need no padding; Llama 4 Scout 12 full + 36 chunked
// -> G = 12, 1 + 3 groups; one kind only (Mistral all local, Llama 3 all full) -> one group of L.
TEST(HybridLayout, PresetsWithoutPadding) {
  const HybridLayout oss = hybrid_layout(find_preset("gpt-oss-120b"), 16);
  EXPECT_EQ(oss.layers_per_group, 18);
  EXPECT_EQ(oss.groups.size(), 2u);
  EXPECT_EQ(oss.padded_layers, 0);
  const HybridLayout scout = hybrid_layout(find_preset("llama-4-scout"), 16);
  EXPECT_EQ(scout.layers_per_group, 12);
  EXPECT_EQ(scout.full_groups, 1);
  EXPECT_EQ(scout.local_groups, 3);
  EXPECT_EQ(scout.padded_layers, 0);
  EXPECT_EQ(scout.groups.back().kind, GroupAttention::kChunkedLocal);
  EXPECT_EQ(scout.groups.back().chunk, 8192);
  const HybridLayout mistral = hybrid_layout(find_preset("mistral-7b"), 16);
  EXPECT_EQ(mistral.layers_per_group, 32);
  EXPECT_EQ(mistral.full_groups, 0);
  EXPECT_EQ(mistral.local_groups, 1);
  const HybridLayout llama = hybrid_layout(find_preset("llama-3-8b"), 16);
  EXPECT_EQ(llama.layers_per_group, 32);
  EXPECT_EQ(llama.groups.size(), 1u);
  EXPECT_EQ(llama.page_bytes, 16 * kv_bytes_per_token(find_preset("llama-3-8b")));
}

// vLLM's exception: 8 full + 9 local, 9 < 1.5 x 8 -> G = 9 (two groups, 1 padded layer) rather
// than G = 8 (three groups, 7 padded).
TEST(HybridLayout, CloseCountsTakeTheLargerGroup) {
  const ModelPreset m =
      apply_overrides(find_preset("gpt-oss-20b"), {.num_layers = 17, .num_local_layers = 9});
  const HybridLayout l = hybrid_layout(m, 16);
  EXPECT_EQ(l.layers_per_group, 9);
  EXPECT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.padded_layers, 1);
}

TEST(HybridLayout, NeededLayerPositions) {
  const ModelPreset& g = find_preset("gemma-3-27b");
  EXPECT_EQ(needed_layer_positions(g, 0), 0);
  EXPECT_EQ(needed_layer_positions(g, 100), 62 * 100);
  EXPECT_EQ(needed_layer_positions(g, 32768), 10 * 32768 + 52 * 1024);
}

// ---- hand-worked replay ------------------------------------------------------------------------

/// 1 full + 1 window-2 layer, 1 KV head of dim 1, fp32: 2 x 4 = 8 bytes per layer-position, 16
/// per token. Budget 192 bytes: paged-1 gets 12 blocks of 16 bytes, hybrid-1 (G = 1, two
/// groups) 24 pages of 8 bytes.
ReplayConfig tiny_hybrid_config() {
  ModelPreset m;
  m.name = "tiny-hybrid";
  m.num_layers = 2;
  m.num_heads = 1;
  m.num_kv_heads = 1;
  m.head_dim = 1;
  m.dtype = DType::kF32;
  m.max_context = 100;
  m.sliding_window = 2;
  m.num_local_layers = 1;
  ReplayConfig c = testing::one_byte_per_token(0);
  c.kv_bytes_per_token = 16;
  c.kv_memory_bytes = 192;
  c.model = m;
  return c;
}

// Three requests at t = 0, each P 2, O 4 (6 positions at the end).
// paged-1 (12 blocks; a request holds T blocks):
//   step 0: admit r0, r1, r2 (2 each), free 6.    step 1: each -> 3, free 3.
//   step 2: each -> 4, free 0.
//   step 3: r0 finds no block: preempt r2 (frees 4; target 2 + 2 = 4, 4 recomputed); r0 -> 5,
//           r1 -> 5, free 2; r2 needs 4: waits.
//   step 4: r0, r1 -> 6 and finish (r2 still waits: admission precedes retirement).
//   step 5: r2 re-admitted (prefill 4).  steps 6, 7: r2 -> 5, 6, finishes.
//   8 steps, 1 preemption, running 3,3,3,2,2,1,1,1 (mean 2), processed 6 + 10 + 4 + 2 = 22.
//   Needed / reserved bytes (the window layer needs min(T, 2) of its T positions), per step:
//   4/4, 5/6, 6/8, 7/10, 8/12, 6/8, 7/10, 8/12 -> mean 364 / 480.
// hybrid-1 (24 pages; full group T pages, window group min(T, 2) after its first release):
//   step 0: admit r0, r1, r2 (2 + 2 pages each), free 12.
//   steps 1-4: each decode at p releases the window block below p - 1 and takes one block per
//   group, net +1: free 9, 6, 3, 0; at step 4 all reach 6 positions and finish.
//   5 steps, no preemption, 3 running throughout, processed 6 + 12 = 18; util 1 every step.
TEST(ReplayHybrid, HandWorkedRunsMoreAtOnceThanPaged) {
  const Trace t = make_trace({{0, 2, 4}, {0, 2, 4}, {0, 2, 4}});
  const ReplayConfig c = tiny_hybrid_config();

  const ReplayResult paged = replay(t, c, {StrategyKind::kPaged, 1});
  EXPECT_EQ(paged.num_blocks, 12);
  EXPECT_EQ(paged.completed, 3);
  EXPECT_EQ(paged.steps, 8);
  EXPECT_EQ(paged.preemptions, 1);
  EXPECT_EQ(paged.recomputed_tokens, 4);
  EXPECT_EQ(paged.peak_concurrency, 3);
  EXPECT_DOUBLE_EQ(paged.mean_concurrency, 2.0);
  EXPECT_EQ(paged.processed_tokens, 22);
  EXPECT_DOUBLE_EQ(paged.util_mean, 1.0);
  EXPECT_NEAR(paged.need_util_mean, 364.0 / 480.0, 1e-12);

  const ReplayResult hybrid = replay(t, c, {StrategyKind::kHybrid, 1});
  EXPECT_EQ(hybrid.strategy, "hybrid-1");
  EXPECT_EQ(hybrid.num_blocks, 24);
  EXPECT_EQ(hybrid.capacity_tokens, 12);  // 24 pages x 8 bytes / 16 bytes per token
  EXPECT_EQ(hybrid.layers_per_group, 1);
  EXPECT_EQ(hybrid.kv_groups, 2);
  EXPECT_EQ(hybrid.padded_layers, 0);
  EXPECT_EQ(hybrid.completed, 3);
  EXPECT_EQ(hybrid.steps, 5);
  EXPECT_EQ(hybrid.preemptions, 0);
  EXPECT_EQ(hybrid.peak_concurrency, 3);
  EXPECT_DOUBLE_EQ(hybrid.mean_concurrency, 3.0);
  EXPECT_EQ(hybrid.processed_tokens, 18);
  EXPECT_DOUBLE_EQ(hybrid.util_mean, 1.0);
  EXPECT_DOUBLE_EQ(hybrid.need_util_mean, 1.0);
  // Reserved pages 12, 15, 18, 21, 24 of 8 bytes over 5 steps.
  EXPECT_DOUBLE_EQ(hybrid.reserved_mean_bytes, 8.0 * (12 + 15 + 18 + 21 + 24) / 5);
}

// A prompt longer than max_batch_tokens is appended in pieces (remainder first), so the window
// group releases between them. P 10, max_batch_tokens 4: pieces [0, 2), [2, 6), [6, 10); the
// last piece's queries read from position 6 - 2 + 1 = 5, so the window group keeps blocks 5..9:
// 10 + 5 = 15 pages instead of 20. Budget 15 pages (120 bytes): admitted alone (the bound of
// its peak is max(10 + 5 in prefill, 11 + 2 in decode) = 15), O = 1: the decode at p = 10
// releases blocks 5..8 and takes 2 -> fits.
TEST(ReplayHybrid, LongPromptIsAppendedInPieces) {
  const Trace t = make_trace({{0, 10, 1}});
  ReplayConfig c = tiny_hybrid_config();
  c.kv_memory_bytes = 120;
  c.max_batch_tokens = 4;
  const ReplayResult r = replay(t, c, {StrategyKind::kHybrid, 1});
  EXPECT_EQ(r.num_blocks, 15);
  EXPECT_EQ(r.completed, 1);
  EXPECT_EQ(r.rejected_too_large, 0);
  EXPECT_EQ(r.preemptions, 0);
  // The same budget holds 7 blocks of paged-1: 11 positions never fit.
  const ReplayResult p = replay(t, c, {StrategyKind::kPaged, 1});
  EXPECT_EQ(p.rejected_too_large, 1);
}

// ---- equal to paged without local layers
// ---------------------------------------------------------

void expect_same_replay(const ReplayResult& a, const ReplayResult& b) {
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.capacity_tokens, b.capacity_tokens);
  EXPECT_EQ(a.num_blocks, b.num_blocks);
  EXPECT_EQ(a.completed, b.completed);
  EXPECT_EQ(a.rejected_too_long, b.rejected_too_long);
  EXPECT_EQ(a.rejected_too_large, b.rejected_too_large);
  EXPECT_EQ(a.util_mean, b.util_mean);
  EXPECT_EQ(a.util_p5, b.util_p5);
  EXPECT_EQ(a.need_util_mean, b.need_util_mean);
  EXPECT_EQ(a.waste_mean_bytes, b.waste_mean_bytes);
  EXPECT_EQ(a.reserved_mean_bytes, b.reserved_mean_bytes);
  EXPECT_EQ(a.peak_concurrency, b.peak_concurrency);
  EXPECT_EQ(a.mean_concurrency, b.mean_concurrency);
  EXPECT_EQ(a.preemptions, b.preemptions);
  EXPECT_EQ(a.recomputed_tokens, b.recomputed_tokens);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.processed_tokens, b.processed_tokens);
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
  EXPECT_EQ(a.queue_mean_steps, b.queue_mean_steps);
  EXPECT_EQ(a.queue_p99_steps, b.queue_p99_steps);
  EXPECT_EQ(a.ttft_p50_ms, b.ttft_p50_ms);
  EXPECT_EQ(a.ttft_p99_ms, b.ttft_p99_ms);
  EXPECT_EQ(a.tpot_p99_ms, b.tpot_p99_ms);
  EXPECT_EQ(a.normalized_latency_s, b.normalized_latency_s);
  EXPECT_EQ(a.throughput_rps, b.throughput_rps);
  ASSERT_EQ(a.series.size(), b.series.size());
  for (size_t i = 0; i < a.series.size(); ++i) {
    EXPECT_EQ(a.series[i].utilization, b.series[i].utilization) << i;
    EXPECT_EQ(a.series[i].concurrency, b.series[i].concurrency) << i;
    EXPECT_EQ(a.series[i].reserved_fraction, b.series[i].reserved_fraction) << i;
  }
}

// Llama-3-8B (all full: one group of 32 layers) under memory pressure on the first 3000 Azure
// conversation requests: the same pages, admissions and preemptions, field by field.
TEST(ReplayHybrid, EqualsPagedWithoutLocalLayers) {
  PAGEDKV_REQUIRE_TRACES();
  Trace t = read_trace((testing::traces_dir() / "AzureLLMInferenceTrace_conv.csv").string());
  t.requests.resize(3000);
  const ModelPreset& m = find_preset("llama-3-8b");
  ReplayConfig c;
  c.model = m;
  c.kv_bytes_per_token = kv_bytes_per_token(m);
  c.kv_memory_bytes = int64_t{1} << 30;  // 8192 positions: preemptions and queueing
  c.max_context = m.max_context;
  c.rate_scale = 2.0;
  const ReplayResult paged = replay(t, c, kPaged16);
  const ReplayResult hybrid = replay(t, c, kHybrid16);
  EXPECT_GT(paged.preemptions, 0);
  EXPECT_EQ(hybrid.layers_per_group, 32);
  EXPECT_EQ(hybrid.padded_layers, 0);
  expect_same_replay(paged, hybrid);
}

// ---- what hybrid refuses -----------------------------------------------------------------------

TEST(ReplayHybrid, RefusesSwapSharingAndNoModel) {
  const Trace t = make_trace({{0, 2, 4}});
  ReplayConfig c = tiny_hybrid_config();
  c.preemption = Preemption::kSwap;
  EXPECT_THAT([&] { (void)replay(t, c, kHybrid16); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("hybrid-16"), HasSubstr("recompute preemption only"))));
  c = tiny_hybrid_config();
  c.group_width = 2;
  EXPECT_THAT([&] { (void)replay(t, c, kHybrid16); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("hybrid-16"), HasSubstr("sharing groups (width 2)"))));
  c = tiny_hybrid_config();
  c.model.reset();
  EXPECT_THAT([&] { (void)replay(t, c, kHybrid16); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("hybrid-16"), HasSubstr("needs the model's layers"))));
  // Other strategies still run without a model (need util then -1).
  EXPECT_EQ(replay(t, c, {StrategyKind::kPaged, 1}).need_util_mean, -1);
}

TEST(ReplayHybrid, RefusesABudgetBelowOnePageAndAMismatchedModel) {
  const Trace t = make_trace({{0, 2, 4}});
  ReplayConfig c = tiny_hybrid_config();
  c.kv_memory_bytes = 16 * 8 - 1;  // a hybrid-16 page is 16 x 1 x 8 bytes
  EXPECT_THAT([&] { (void)replay(t, c, kHybrid16); },
              ::testing::ThrowsMessage<Error>(HasSubstr("holds no page of hybrid-16")));
  c = tiny_hybrid_config();
  c.kv_bytes_per_token = 32;
  EXPECT_THAT([&] { (void)replay(t, c, kHybrid16); },
              ::testing::ThrowsMessage<Error>(HasSubstr("disagree with model 'tiny-hybrid'")));
}

TEST(ReplayHybrid, StrategyNames) {
  EXPECT_EQ(kHybrid16.name(), "hybrid-16");
  const Strategy s = parse_strategy("hybrid-32");
  EXPECT_EQ(s.kind, StrategyKind::kHybrid);
  EXPECT_EQ(s.block_size, 32);
  EXPECT_THAT([] { (void)parse_strategy("hybrid-prefix-16"); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("hybrid-prefix-16"), HasSubstr("not available yet"))));
  EXPECT_THAT([] { (void)parse_strategy("hybrid"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("hybrid-<block size>")));
}

// ---- a real trace ------------------------------------------------------------------------------

// Gemma-3-27B on 2000 Azure conversation requests at 8 GiB: the same requests complete; hybrid
// holds less per request, so it runs at least as many at once with fewer preemptions, and its
// need utilization (= its utilization) is far above paged's, whose window layers keep history
// no query reads.
TEST(ReplayHybrid, Gemma3OnAzureConv) {
  PAGEDKV_REQUIRE_TRACES();
  Trace t = read_trace((testing::traces_dir() / "AzureLLMInferenceTrace_conv.csv").string());
  t.requests.resize(2000);
  const ModelPreset& m = find_preset("gemma-3-27b");
  ReplayConfig c;
  c.model = m;
  c.kv_bytes_per_token = kv_bytes_per_token(m);
  c.kv_memory_bytes = int64_t{8} << 30;
  c.max_context = m.max_context;
  c.rate_scale = 4.0;
  const ReplayResult paged = replay(t, c, kPaged16);
  const ReplayResult hybrid = replay(t, c, kHybrid16);
  EXPECT_EQ(hybrid.completed, 2000);
  EXPECT_EQ(paged.completed, 2000);
  EXPECT_EQ(hybrid.completed + hybrid.rejected_too_long + hybrid.rejected_too_large, 2000);
  EXPECT_GE(hybrid.mean_concurrency, paged.mean_concurrency);
  EXPECT_LE(hybrid.preemptions, paged.preemptions);
  EXPECT_DOUBLE_EQ(hybrid.need_util_mean, hybrid.util_mean);
  EXPECT_LE(hybrid.util_mean, 1.0);
  EXPECT_GT(hybrid.util_mean, paged.need_util_mean);
  EXPECT_EQ(hybrid.padded_layers, 8);
}

}  // namespace
}  // namespace pagedkv::sim

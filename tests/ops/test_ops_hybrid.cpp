// Tests for `pagedkv ops` on a hybrid manager (src/ops/ops_hybrid.cpp, docs/ops-script.md "KV
// cache groups"): the release positions of a window group and a chunked group against the rule
// worked out by hand, the group list's errors, failed appends that change nothing, and a plain
// `manager` line after a hybrid one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Window W = 8 and chunk C = 8 at block size 4, one token at a time from position 8 to 40.
// Window: before the append at p, entry k (positions 4k..4k+3) goes once 4k + 3 < p - W + 1,
// i.e. at p = 4k + 11. Chunk: entries wholly below floor(p / 8) * 8 go, the two of a chunk
// at the next chunk's first position p = 8m.
TEST(OpsHybrid, ReleasePositionsFollowTheWindowAndChunkRules) {
  std::string script = "manager blocks=64 block_size=4 groups=full,window:8,chunk:8\nadd 1\n";
  script += "append 1 n=8\n";
  for (int p = 8; p <= 40; ++p) script += "append 1 n=1\n";
  const std::vector<json> out = run_ops_script(script);
  ASSERT_EQ(out.size(), 34u);
  int64_t window_released = 0;
  int64_t chunk_released = 0;
  for (int p = 8; p <= 40; ++p) {
    SCOPED_TRACE("position " + std::to_string(p));
    const json& j = out[static_cast<size_t>(p - 7)];
    ASSERT_TRUE(j["ok"].get<bool>());
    EXPECT_TRUE(j["released"][0].empty());  // the full group keeps everything
    const bool window_due = p >= 11 && (p - 11) % 4 == 0;
    EXPECT_EQ(j["released"][1].size(), window_due ? 1u : 0u);
    const bool chunk_due = p % 8 == 0;
    EXPECT_EQ(j["released"][2].size(), chunk_due ? 2u : 0u);
    window_released += static_cast<int64_t>(j["released"][1].size());
    chunk_released += static_cast<int64_t>(j["released"][2].size());
    // A new block opens in every group at each block boundary.
    EXPECT_EQ(j["new_blocks"][0].size(), p % 4 == 0 ? 1u : 0u);
  }
  EXPECT_EQ(window_released, 8);  // p = 11, 15, ..., 39
  EXPECT_EQ(chunk_released, 10);  // two at each of p = 8, 16, 24, 32, 40
}

TEST(OpsHybrid, GroupListErrorsNameTheGroup) {
  const auto fails = [](const std::string& groups, const std::string& message) {
    EXPECT_THAT([&] { (void)run_ops_script("manager blocks=4 groups=" + groups + "\n"); },
                ThrowsMessage<Error>(HasSubstr(message)))
        << groups;
  };
  fails("window", "group 'window' is not full, window:W, window:W:S or chunk:C");
  fails("full:2", "group 'full:2' is not");
  fails("slide:3", "group 'slide:3' is not");
  fails("full,,full", "group '' is not");
  fails("window:x", "line 1: manager:");
  fails("chunk:0", "chunk");
  fails("window:0", "window >= 1");
  std::string many = "full";
  for (int i = 0; i < 64; ++i) many += ",full";
  fails(many, "more than 64 groups");
  EXPECT_THAT([] { (void)run_ops_script("manager blocks=4 groups=full policy=window\n"); },
              ThrowsMessage<Error>(HasSubstr("unknown option 'policy'")));
}

TEST(OpsHybrid, OnlyItsOpsRunAndAFailedAppendChangesNothing) {
  OpsExecutor ex;
  const auto lines = parse_ops_script(
      "manager blocks=3 block_size=2 groups=full,window:2\n"
      "add 1\n"
      "append 1 n=2\n"  // one block per group
      "dump\n"
      "append 1 n=3\n"  // 2 more blocks per group (p = 2 still sees 1), 1 free
      "dump\n");
  std::vector<json> out;
  for (const OpsLine& l : lines) {
    if (auto j = ex.execute(l)) out.push_back(*j);
  }
  ASSERT_EQ(out.size(), 4u);
  EXPECT_FALSE(out[2]["ok"].get<bool>());
  EXPECT_EQ(out[2]["error"], "no_free_blocks");
  EXPECT_EQ(out[2]["blocks_needed"], 4);
  json before = out[1];
  json after = out[3];
  before.erase("line");
  after.erase("line");
  EXPECT_EQ(before, after);
  EXPECT_EQ(ex.held_tokens(), 2);
  ASSERT_NE(ex.hybrid_manager(), nullptr);
  EXPECT_EQ(ex.manager(), nullptr);
  ex.hybrid_manager()->check_invariants();
  for (const char* op : {"stats", "lookup 1 5", "swap_out 1", "commit 1 1"}) {
    EXPECT_THAT([&] { (void)ex.execute(parse_ops_script(op).at(0)); },
                ThrowsMessage<Error>(HasSubstr("not an op of a manager with groups")))
        << op;
  }
  EXPECT_THAT([&] { (void)ex.execute(parse_ops_script("add 2 7 8").at(0)); },
              ThrowsMessage<Error>(HasSubstr("takes no prompt")));
  // A plain manager line replaces the hybrid one.
  (void)ex.execute(parse_ops_script("manager blocks=2").at(0));
  EXPECT_EQ(ex.hybrid_manager(), nullptr);
  ASSERT_NE(ex.manager(), nullptr);
  EXPECT_EQ(ex.held_tokens(), 0);
}

}  // namespace
}  // namespace pagedkv::ops

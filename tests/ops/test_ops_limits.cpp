// Issue 16, items 9 and 10: `pagedkv ops` is bounded against hostile scripts (per-op and
// script-wide token limits checked before anything is allocated, output of an append that does
// not grow with the table, a reader that enforces the line limit while reading and refuses
// non-regular files, escaped control bytes), and can say what tests need (expect_error, the
// reference counts and the prefix index in dump, batch_metadata).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using json = nlohmann::ordered_json;

/// Runs `script` line by line on `ex`; returns the message of the first error ("" if none).
std::string run_on(OpsExecutor& ex, const std::string& script, std::vector<json>* out = nullptr) {
  try {
    for_each_ops_line(script, [&](const OpsLine& l) {
      if (auto j = ex.execute(l); j && out != nullptr) out->push_back(*j);
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(OpsLimits, ATokenCountOverThePerOpLimitIsAnErrorNamingItBeforeAnyAllocation) {
  OpsExecutor ex;
  ASSERT_EQ(run_on(ex, "manager blocks=8 block_size=4\nadd 1 5 6 7\n"), "");
  // 2^31 slots would be 16 GiB of slot list: refused from the number alone.
  EXPECT_EQ(run_on(ex, "append 1 n=2147483647\n"),
            "line 1: append: 2147483647 tokens exceed the limit of 65536 tokens per op");
  EXPECT_THAT(run_on(ex, "can_append 1 65537\n"), HasSubstr("65537 tokens exceed the limit"));
  EXPECT_THAT(run_on(ex, "can_append 1 1 lookahead=99999999\n"),
              HasSubstr("99999999 tokens exceed the limit of 65536"));
  EXPECT_THAT(run_on(ex, "add 2 1 chunk=70000\n"), HasSubstr("70000 tokens exceed the limit"));
  EXPECT_THAT(run_on(ex, "batch_metadata 1:65537\n"),
              HasSubstr("65537 tokens exceed the limit of 65536 tokens per op"));
  // 65537 token ids on one line (a 131 KB line, under the line limit).
  EXPECT_EQ(run_on(ex, "add 2" + repeat(" 1", 65537) + "\n"),
            "line 1: add: 65537 tokens exceed the limit of 65536 tokens per op");
  EXPECT_EQ(run_on(ex, "score 1" + repeat(" 0.5", 65537) + "\n"),
            "line 1: score: 65537 weights exceed the limit of 65536 tokens per op");
  // Exactly the limit is accepted; nothing above changed the manager.
  EXPECT_EQ(ex.held_tokens(), 3);
  EXPECT_EQ(ex.manager()->num_sequences(), 1);
  std::vector<json> out;
  EXPECT_EQ(run_on(ex, "can_append 1 65536\n", &out), "");
  EXPECT_EQ(out.at(0)["blocks_needed"], 16384);  // ceil(65539 / 4) - 1 blocks held
}

TEST(OpsLimits, TokensHeldCountForksPreemptedSequencesAndGiveBackOnFreeAndTruncate) {
  OpsExecutor ex;
  ASSERT_EQ(run_on(ex, "manager blocks=4097 block_size=16\nadd 1\nappend 1 n=65536\n"), "");
  EXPECT_EQ(ex.held_tokens(), 65536);
  ASSERT_EQ(run_on(ex, "fork 1 2\n"), "");  // the child copies 65536 token ids
  EXPECT_EQ(ex.held_tokens(), 2 * 65536);
  ASSERT_EQ(run_on(ex, "truncate 2 100\n"), "");
  EXPECT_EQ(ex.held_tokens(), 65536 + 100);
  ASSERT_EQ(run_on(ex, "free 2\n"), "");
  EXPECT_EQ(ex.held_tokens(), 65536);
  // A preempted sequence's token ids stay with the executor for resume: still counted.
  ASSERT_EQ(run_on(ex, "add 3 1 2 3\npreempt 3\n"), "");
  EXPECT_EQ(ex.held_tokens(), 65536 + 3);
  ASSERT_EQ(run_on(ex, "resume 3\n"), "");
  EXPECT_EQ(ex.held_tokens(), 65536 + 3);
  ASSERT_EQ(run_on(ex, "free 3\n"), "");
  std::string forks;
  for (int c = 2; c <= 16; ++c) forks += "fork 1 " + std::to_string(c) + "\n";
  ASSERT_EQ(run_on(ex, forks), "");
  EXPECT_EQ(ex.held_tokens(), int64_t{1} << 20);
  EXPECT_EQ(run_on(ex, "fork 1 17\n"),
            "line 1: fork: 65536 more tokens would hold 1114112 in all, over the limit of "
            "1048576 tokens per script");
  EXPECT_EQ(run_on(ex, "add 17 5\n"),
            "line 1: add: 1 more tokens would hold 1048577 in all, over the limit of 1048576 "
            "tokens per script");
  EXPECT_FALSE(ex.manager()->has_sequence(17));
  EXPECT_EQ(ex.held_tokens(), int64_t{1} << 20);
  // A new manager starts the count over.
  ASSERT_EQ(run_on(ex, "manager blocks=2\n"), "");
  EXPECT_EQ(ex.held_tokens(), 0);
}

TEST(OpsLimits, SequencesHeldIncludePreemptedOnes) {
  // 1.5 million `add N` lines (16 MiB) made 1.2 GB of empty sequences; now 65536 at most.
  OpsExecutor ex;
  std::string script = "manager blocks=4 block_size=2\nadd 0 1 2\npreempt 0\n";
  for (int s = 1; s < 65536; ++s) script += "add " + std::to_string(s) + "\n";
  ASSERT_EQ(run_on(ex, script), "");
  EXPECT_EQ(ex.manager()->num_sequences(), 65535);
  EXPECT_EQ(run_on(ex, "add 70000\n"),
            "line 1: add: 65536 sequences held (preempted ones included), the limit of 65536 "
            "sequences per script");
  EXPECT_THAT(run_on(ex, "fork 1 70000\n"), HasSubstr("the limit of 65536 sequences"));
  // Resuming a preempted sequence moves it back: allowed at the limit.
  ASSERT_EQ(run_on(ex, "resume 0\nfree 1\nadd 70000\n"), "");
  EXPECT_EQ(ex.manager()->num_sequences(), 65536);
}

TEST(OpsLimits, TheWorkBudgetBoundsRepeatedWork) {
  // A `dump` line of 5 bytes printed the whole state: a million of them wrote without bound.
  // Every op is charged, before it runs, a unit per token or block it touches or prints.
  OpsExecutor ex(10000);
  ASSERT_EQ(run_on(ex, "manager blocks=64 block_size=1\n"), "");  // 1 + 64 blocks
  ASSERT_EQ(run_on(ex, "add 1\nappend 1 n=64\n"), "");            // 1, then 1 + 64 tokens
  EXPECT_EQ(ex.work_left(), 10000 - 65 - 1 - 65);
  // dump: 1 for the line, 1 per sequence, 2 per table entry or cached block: 130 each.
  ASSERT_EQ(run_on(ex, repeat("dump\n", 75)), "");
  EXPECT_EQ(ex.work_left(), 119);
  EXPECT_EQ(run_on(ex, "dump\n"),
            "line 1: dump: needs 128 work units, more than the 117 left of the script's budget "
            "(16777216 + 2 per script byte)");
  // A refused `manager` line leaves the manager it would have replaced.
  EXPECT_THAT(run_on(ex, "manager blocks=200\n"), HasSubstr("needs 200 work units"));
  EXPECT_EQ(ex.manager()->num_total_blocks(), 64);
  EXPECT_EQ(OpsLimits::work_budget(1000), (int64_t{1} << 24) + 2000);
}

TEST(OpsLimits, AppendPrintsWhatChangedNotTheTable) {
  // 10^6 single-token appends printed the whole table each time (56 GB). Now the output of the
  // last append of 4000 is as long as the first's: slots, copies and the blocks it added.
  OpsExecutor ex;
  std::vector<json> out;
  ASSERT_EQ(
      run_on(ex, "manager blocks=5000 block_size=1\nadd 1\n" + repeat("append 1 7\n", 4000), &out),
      "");
  ASSERT_EQ(out.size(), 4001u);
  EXPECT_EQ(
      out[1].dump(),
      R"({"op":"append","line":3,"seq":1,"ok":true,"slots":[0],"copies":[],"new_blocks":[0]})");
  EXPECT_EQ(out[4000].dump(), R"({"op":"append","line":4002,"seq":1,"ok":true,"slots":[3999],)"
                              R"("copies":[],"new_blocks":[3999]})");
  for (const json& j : out) EXPECT_FALSE(j.contains("table") && j["op"] == "append");
}

TEST(OpsInput, TheLineLimitIsEnforcedWhileReading) {
  // /dev/zero never ends and has no newline: the reader stops at the line limit.
  std::FILE* zero = std::fopen("/dev/zero", "rb");
  ASSERT_NE(zero, nullptr);
  EXPECT_THAT([&] { (void)read_ops_script(zero, "<stdin>"); },
              ThrowsMessage<Error>(HasSubstr("line 1: line longer than 1048576 bytes")));
  std::fclose(zero);
  // The line counts restart after each newline: line 3 is the long one.
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const std::string text =
      "manager blocks=1\nstats\n" + std::string(OpsLimits::kMaxLineBytes + 1, 'x');
  std::fwrite(text.data(), 1, text.size(), f);
  std::rewind(f);
  EXPECT_THAT([&] { (void)read_ops_script(f, "t"); },
              ThrowsMessage<Error>(HasSubstr("line 3: line longer than 1048576 bytes")));
  // A line of exactly the limit reads back whole.
  std::rewind(f);
  ASSERT_EQ(::ftruncate(::fileno(f), static_cast<off_t>(text.size() - 1)), 0);
  EXPECT_EQ(read_ops_script(f, "t").size(), text.size() - 1);
  std::fclose(f);
  EXPECT_THAT([] { (void)parse_ops_script(std::string(OpsLimits::kMaxScriptBytes + 1, '\n')); },
              ThrowsMessage<Error>(HasSubstr("script longer than 16777216 bytes")));
}

TEST(OpsInput, OnlyRegularFilesAreReadByName) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ops_input_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_THAT([&] { (void)read_ops_script_file(dir.string()); },
              ThrowsMessage<Error>(HasSubstr("': is a directory")));
  EXPECT_THAT([] { (void)read_ops_script_file("/dev/zero"); },
              ThrowsMessage<Error>(HasSubstr("'/dev/zero': is a character device")));
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Refused without waiting for a writer.
  EXPECT_THAT([&] { (void)read_ops_script_file(fifo); },
              ThrowsMessage<Error>(HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT([&] { (void)read_ops_script_file((dir / "missing").string()); },
              ThrowsMessage<Error>(HasSubstr("No such file")));
  const std::string ok = (dir / "ok.ops").string();
  {
    std::FILE* f = std::fopen(ok.c_str(), "wb");
    std::fputs("manager blocks=1\n", f);
    std::fclose(f);
  }
  EXPECT_EQ(read_ops_script_file(ok), "manager blocks=1\n");
  std::filesystem::remove_all(dir);
}

TEST(OpsInput, ControlBytesAreEscapedInMessages) {
  EXPECT_THAT([] { (void)parse_ops_script("manager blocks=1\n\x1b[2Jwipe 1\n"); },
              ThrowsMessage<Error>(HasSubstr("line 2: unknown op '\\x1b[2Jwipe'")));
  EXPECT_THAT([] { (void)run_ops_script("manager blocks=\x07\x08\n"); },
              ThrowsMessage<Error>(HasSubstr("blocks must be an integer, got '\\x07\\x08'")));
  EXPECT_THAT([] { (void)run_ops_script("manager blocks=1\nadd 1 \xff\xfe\n"); },
              ThrowsMessage<Error>(HasSubstr("token id must be an integer, got '\\xff\\xfe'")));
  // A long token is cut: the message stays short.
  const std::string msg = [] {
    try {
      (void)run_ops_script("manager blocks=1\nadd " + std::string(100000, '9') + "x\n");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_LT(msg.size(), 200u);
  EXPECT_THAT(msg, HasSubstr("..."));
  EXPECT_EQ(printable("a\\b\n"), "a\\\\b\\x0a");
}

TEST(OpsExpectError, ContinuesWithTheStateUnchanged) {
  OpsExecutor ex;
  std::vector<json> out;
  ASSERT_EQ(run_on(ex,
                   "manager blocks=4 block_size=2 prefix=on\nadd 1 1 2 3\ndump\n"
                   "expect_error append 1 n=99999\nexpect_error free 9\n"
                   "expect_error commit 1 7\nexpect_error manager blocks=0\ndump\n",
                   &out),
            "");
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(out[2].dump(), R"({"op":"expect_error","line":4,"expected":"append","error":)"
                           R"("append: 99999 tokens exceed the limit of 65536 tokens per op"})");
  EXPECT_THAT(out[3]["error"].get<std::string>(), HasSubstr("unknown sequence 9"));
  EXPECT_THAT(out[4]["error"].get<std::string>(), HasSubstr("commit: "));
  EXPECT_THAT(out[5]["error"].get<std::string>(), HasSubstr("blocks must be in [1, 262144]"));
  json before = out[1];
  json after = out[6];
  before.erase("line");
  after.erase("line");
  EXPECT_EQ(before, after);  // the first manager, as it was
  EXPECT_EQ(run_on(ex, "expect_error stats\n").substr(0, 41),
            "line 1: expect_error: stats succeeded (it");
  EXPECT_EQ(run_on(ex, "expect_error fork 1 2\n"), "line 1: expect_error: fork succeeded");
  EXPECT_THAT([] { (void)parse_ops_script("expect_error\n"); },
              ThrowsMessage<Error>(HasSubstr("line 1: expect_error: expected an op")));
  EXPECT_THAT([] { (void)parse_ops_script("expect_error expect_error stats\n"); },
              ThrowsMessage<Error>(HasSubstr("cannot be nested")));
  EXPECT_THAT([] { (void)parse_ops_script("expect_error frob 1\n"); },
              ThrowsMessage<Error>(HasSubstr("line 1: unknown op 'frob'")));
}

TEST(OpsDump, ReferenceCountsAndThePrefixIndex) {
  const std::vector<json> out = run_ops_script(
      "manager blocks=4 block_size=2 prefix=on\n"
      "add 1 1 2 3 4 5\n"  // blocks 0 [1 2], 1 [3 4], 2 [5]
      "commit 1 5\n"       // 0 and 1 published
      "fork 1 2\n"         // every block shared
      "free 1\n"
      "dump\n");
  ASSERT_EQ(out.size(), 3u);
  const json& d = out[2];
  EXPECT_EQ(d["ref_counts"].dump(), R"({"0":1,"1":1,"2":1})");
  EXPECT_EQ(d["sequences"].dump(), R"([{"seq":2,"tokens":5,"committed":5,"table":[0,1,2]}])");
  ASSERT_EQ(d["prefix_index"].size(), 2u);
  EXPECT_EQ(d["prefix_index"][0]["block"], 0);
  EXPECT_EQ(d["prefix_index"][0]["parent"], "0x9e3779b97f4a7c15");  // kRootBlockHash
  EXPECT_EQ(d["prefix_index"][0]["tokens"].dump(), "[1,2]");
  EXPECT_EQ(d["prefix_index"][1]["block"], 1);
  EXPECT_EQ(d["prefix_index"][1]["parent"], d["prefix_index"][0]["hash"]);
  EXPECT_EQ(d["prefix_index"][1]["tokens"].dump(), "[3,4]");
}

TEST(OpsBatchMetadata, PaddingRowsAndTheTableSizeLimit) {
  const std::vector<json> out =
      run_ops_script("manager blocks=4 block_size=2\nadd 1 1 2 3\nbatch_metadata -1 1:2\n");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].dump(),
            R"({"op":"batch_metadata","line":3,"block_size":2,"block_tables":[[-1,-1],[0,1]],)"
            R"("context_lens":[0,3],"slot_mapping":[1,2],"query_start":[0,0,2],)"
            R"("csr":{"indptr":[0,0,2],"indices":[0,1],"last_page_len":[0,1]}})");
  // 70000 padding rows x 1 entry: over the limit before anything is built.
  EXPECT_THAT(
      [] {
        (void)run_ops_script("manager blocks=4\n" + std::string("batch_metadata") +
                             repeat(" -1", 70000) + "\n");
      },
      ThrowsMessage<Error>(HasSubstr("70000 padded table entries exceed the limit")));
}

}  // namespace
}  // namespace pagedkv::ops

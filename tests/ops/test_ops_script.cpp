// Tests for src/ops/ops_script.hpp (`pagedkv ops`): every worked example of docs/ops-script.md
// is run and its output compared with the page, line by line; parser and executor errors carry
// the line number; a failed operation changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using json = nlohmann::ordered_json;

struct DocExample {
  int64_t doc_line = 0;  // line of the ```ops fence in the page
  std::string script;
  std::string expected;  // the ```json or ```error block that follows
  bool is_error = false;
};

std::vector<DocExample> doc_examples() {
  std::ifstream in(std::string(PAGEDKV_SOURCE_DIR) + "/docs/ops-script.md");
  EXPECT_TRUE(in) << "docs/ops-script.md not found";
  std::vector<DocExample> out;
  std::string line;
  int64_t n = 0;
  std::string* target = nullptr;
  while (std::getline(in, line)) {
    ++n;
    if (target == nullptr) {
      if (line == "```ops") {
        out.push_back({.doc_line = n});
        target = &out.back().script;
      } else if ((line == "```json" || line == "```error") && !out.empty() &&
                 out.back().expected.empty()) {
        out.back().is_error = line == "```error";
        target = &out.back().expected;
      }
    } else if (line == "```") {
      target = nullptr;
    } else {
      *target += line + "\n";
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream ss(text);
  for (std::string l; std::getline(ss, l);) {
    if (!l.empty()) v.push_back(l);
  }
  return v;
}

TEST(OpsScriptDoc, EveryWorkedExampleProducesTheDocumentedOutput) {
  const std::vector<DocExample> examples = doc_examples();
  ASSERT_GE(examples.size(), 10u);
  for (const DocExample& ex : examples) {
    SCOPED_TRACE("docs/ops-script.md example at line " + std::to_string(ex.doc_line));
    ASSERT_FALSE(ex.expected.empty()) << "an ops block must be followed by a json/error block";
    if (ex.is_error) {
      try {
        (void)run_ops_script(ex.script);
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()) + "\n", ex.expected);
      }
      continue;
    }
    const std::vector<json> got = run_ops_script(ex.script);
    const std::vector<std::string> want = lines_of(ex.expected);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Compared as text: key order and number formatting are part of the documented output.
      EXPECT_EQ(got[i].dump(), want[i]) << "output line " << i + 1;
    }
  }
}

TEST(OpsScriptParser, CommentsBlankLinesAndOptions) {
  const auto lines = parse_ops_script(
      "# a comment\n\n  manager blocks=4\tblock_size=2   # trailing\nadd 1 5 6 extra=3\r\n");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].line, 3);
  EXPECT_EQ(lines[0].op, "manager");
  EXPECT_EQ(lines[0].options.at("block_size"), "2");
  EXPECT_EQ(lines[1].line, 4);
  EXPECT_THAT(lines[1].args, ::testing::ElementsAre("1", "5", "6"));
  EXPECT_EQ(lines[1].options.at("extra"), "3");
}

TEST(OpsScriptParser, ErrorsNameTheLine) {
  EXPECT_THAT([] { (void)parse_ops_script("manager blocks=1\n\nfrobnicate 3\n"); },
              ThrowsMessage<Error>(HasSubstr("line 3: unknown op 'frobnicate'")));
  EXPECT_THAT([] { (void)parse_ops_script("add 1 x=1 2\n"); },
              ThrowsMessage<Error>(HasSubstr("line 1: add: positional argument '2' after")));
  EXPECT_THAT([] { (void)parse_ops_script("manager blocks=1 blocks=2\n"); },
              ThrowsMessage<Error>(HasSubstr("line 1: manager: option 'blocks' given twice")));
  EXPECT_THAT([] { (void)parse_ops_script("manager =3\n"); },
              ThrowsMessage<Error>(HasSubstr("malformed option '=3'")));
  // Non-printable bytes are not echoed raw: \xNN, so the message stays one printable line.
  EXPECT_THAT([] { (void)parse_ops_script(std::string("\x01\x02 1\n")); },
              ThrowsMessage<Error>(HasSubstr("unknown op '\\x01\\x02'")));
}

TEST(OpsScriptExecutor, ArgumentErrorsNameTheLineAndValue) {
  auto run = [](const char* s) { (void)run_ops_script(s); };
  EXPECT_THAT([&] { run("manager block_size=2\n"); },
              ThrowsMessage<Error>(HasSubstr("line 1: manager: blocks=N is required")));
  EXPECT_THAT([&] { run("manager blocks=0\n"); },
              ThrowsMessage<Error>(HasSubstr("blocks must be in [1, 262144], got 0")));
  EXPECT_THAT([&] { run("manager blocks=2 policy=lru\n"); },
              ThrowsMessage<Error>(HasSubstr("policy must be none, window, sinks or h2o")));
  EXPECT_THAT([&] { run("manager blocks=2 prefix=maybe\n"); },
              ThrowsMessage<Error>(HasSubstr("prefix must be on or off, got 'maybe'")));
  EXPECT_THAT([&] { run("manager blocks=2 colour=red\n"); },
              ThrowsMessage<Error>(HasSubstr("unknown option 'colour'")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1 2\nfork 1\n"); },
              ThrowsMessage<Error>(HasSubstr("line 3: fork: expected PARENT CHILD, got 1")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd x\n"); },
              ThrowsMessage<Error>(HasSubstr("line 2: add: sequence id must be an integer")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1 99999999999\n"); },
              ThrowsMessage<Error>(HasSubstr("token id must be in [0, 2147483647]")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1\nadd 1\n"); },
              ThrowsMessage<Error>(HasSubstr("line 3: add: sequence 1 already exists")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1 5\nappend 1 6 n=2\n"); },
              ThrowsMessage<Error>(HasSubstr("give either tokens or n=COUNT")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1 5\nscore 1 1\n"); },
              ThrowsMessage<Error>(HasSubstr("line 3: score: ")));
  EXPECT_THAT([&] { run("manager blocks=2\nresume 4\n"); },
              ThrowsMessage<Error>(HasSubstr("line 2: resume: sequence 4 was not preempted")));
  EXPECT_THAT([&] { run("manager blocks=2\nadd 1 5\nappend 1 n=2\npreempt 1\nresume 1\n"); },
              ThrowsMessage<Error>(HasSubstr("token ids unknown")));
}

TEST(OpsScriptExecutor, FailedOperationsChangeNothing) {
  OpsExecutor ex;
  const auto lines = parse_ops_script(
      "manager blocks=2 block_size=2 host_blocks=1 prefix=on\n"
      "add 1 1 2 3\n"
      "dump\n"
      "add 2 4 5\n"     // no block left
      "append 1 4 5\n"  // 5 tokens need 3 blocks: more than the pool
      "swap_out 1\n"    // needs 2 host blocks: more than the host pool
      "dump\n");
  std::vector<json> out;
  for (const auto& l : lines) {
    if (auto j = ex.execute(l)) out.push_back(*j);
  }
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out[2]["error"], "no_free_blocks");
  EXPECT_EQ(out[2]["admission"], "later");
  EXPECT_EQ(out[3]["error"], "never_fits");
  EXPECT_EQ(out[3]["admission"], "never");
  EXPECT_EQ(out[4]["error"], "never_fits");
  EXPECT_EQ(out[4]["admission"], "never");
  json before = out[1];
  json after = out[5];
  before.erase("line");
  after.erase("line");
  EXPECT_EQ(before, after);
  ASSERT_NE(ex.manager(), nullptr);
  ex.manager()->check_invariants();
}

TEST(OpsScriptExecutor, SecondManagerLineStartsOver) {
  const auto out = run_ops_script(
      "manager blocks=2\nadd 1 1\nmanager blocks=3 block_size=1\nadd 1 7 8\nstats\n");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2]["blocks"]["total"], 3);
  EXPECT_EQ(out[2]["sequences"], 1);
}

}  // namespace
}  // namespace pagedkv::ops

// Tests for src/sim/trace.hpp: the Azure CSV and Mooncake JSONL readers on small inline samples
// (every bad-input case, strict and skipping), and on the real traces in ../shared/traces with
// the row counts and statistics that traces/SOURCES.md states.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "pagedkv/error.hpp"
#include "sim/trace.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

Trace azure(const std::string& text, bool strict = false) {
  std::istringstream in(text);
  return read_azure_csv(in, "t.csv", {.strict = strict});
}

Trace mooncake(const std::string& text, bool strict = false) {
  std::istringstream in(text);
  return read_mooncake_jsonl(in, "t.jsonl", {.strict = strict});
}

/// The message a strict read throws.
std::string strict_error(const std::string& text, bool jsonl) {
  try {
    if (jsonl) {
      (void)mooncake(text, true);
    } else {
      (void)azure(text, true);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr const char* kHeader = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

// ---- Azure CSV --------------------------------------------------------------------------------

TEST(AzureCsv, ReadsRowsWithRelativeArrivalTimes) {
  const Trace t = azure(std::string(kHeader) +
                        "2023-11-16 18:15:46.6805900,374,44\n"
                        "2023-11-16 18:15:50.9951690,396,109\n"
                        "2023-11-16 18:15:50.9951690,879,0\n"
                        "2023-11-16 18:16:00,1,7");  // no final newline, as the conv file
  ASSERT_EQ(t.requests.size(), 4u);
  EXPECT_EQ(t.rows_read, 4);
  EXPECT_EQ(t.rows_skipped, 0);
  EXPECT_EQ(t.format, TraceFormat::kAzureCsv);
  EXPECT_EQ(t.requests[0].arrival_ms, 0.0);
  EXPECT_NEAR(t.requests[1].arrival_ms, 4314.579, 1e-6);
  EXPECT_NEAR(t.requests[2].arrival_ms, 4314.579, 1e-6);
  EXPECT_NEAR(t.requests[3].arrival_ms, 13319.41, 1e-6);
  EXPECT_EQ(t.requests[0].prompt_tokens, 374);
  EXPECT_EQ(t.requests[0].output_tokens, 44);
  EXPECT_EQ(t.requests[2].output_tokens, 0);  // prefill-only requests are legal
  EXPECT_EQ(t.requests[3].line, 5);
  EXPECT_EQ(t.requests[0].hash_count, 0u);
}

TEST(AzureCsv, ColumnsInAnyOrderCrlfQuotesAndBom) {
  const Trace t = azure(
      "\xEF\xBB\xBF\"GeneratedTokens\",ContextTokens,TIMESTAMP\r\n"
      "5,\"100\",2023-11-16 23:59:59.5\r\n"
      "6,200,2023-11-17 00:00:00.5\r\n");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[1].prompt_tokens, 200);
  EXPECT_EQ(t.requests[1].output_tokens, 6);
  EXPECT_NEAR(t.requests[1].arrival_ms, 1000.0, 1e-9);  // across midnight
}

TEST(AzureCsv, NumericSecondsTimestamps) {
  const Trace t = azure(std::string(kHeader) + "10.5,1,1\n12,2,2\n");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_NEAR(t.requests[1].arrival_ms, 1500.0, 1e-9);
}

TEST(ParseTimestamp, HandWorkedValuesAndYearsOutsideInt64NanosecondsAreRejected) {
  int64_t ns = 0;
  // 1970-01-02 00:00:01.5 = 86401.5 s after the epoch.
  ASSERT_TRUE(parse_timestamp_ns("1970-01-02 00:00:01.5", ns));
  EXPECT_EQ(ns, 86'401'500'000'000);
  // Year 1011 (found by fuzz_trace) would overflow int64 nanoseconds: a bad row, not UB.
  EXPECT_FALSE(parse_timestamp_ns("1011-11-16 18:17:03.9799600", ns));
  EXPECT_FALSE(parse_timestamp_ns("9999-01-01 00:00:00", ns));
  EXPECT_TRUE(parse_timestamp_ns("2023-11-16 18:17:03.9799600", ns));
}

TEST(AzureCsv, MissingColumnAlwaysThrowsNamingIt) {
  for (bool strict : {false, true}) {
    try {
      (void)azure("TIMESTAMP,ContextTokens,Output\n2023-11-16 18:15:46,1,1\n", strict);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("t.csv:1: missing column 'GeneratedTokens'"));
      EXPECT_THAT(e.what(), HasSubstr("found: TIMESTAMP,ContextTokens,Output"));
    }
  }
}

TEST(AzureCsv, EmptyFileThrows) {
  EXPECT_THAT([] { (void)azure(""); },
              ::testing::ThrowsMessage<Error>(HasSubstr("t.csv:1: empty file")));
}

TEST(AzureCsv, UnknownColumnWarnsOrFailsWhenStrict) {
  const std::string text =
      "TIMESTAMP,ContextTokens,GeneratedTokens,Model\n"
      "2023-11-16 18:15:46,10,2,gpt\n";
  const Trace t = azure(text);
  ASSERT_EQ(t.requests.size(), 1u);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_EQ(t.warnings[0], "t.csv:1: ignoring unknown column 'Model'");
  EXPECT_EQ(strict_error(text, false), "t.csv:1: ignoring unknown column 'Model' (--strict)");
}

struct BadRow {
  const char* name;
  const char* row;
  const char* reason;
  const char* message;
};

/// `text` holds one bad row between two good ones, the second of which has a 30-token prompt:
/// the bad row is skipped and counted under its reason with a message naming its line, and a
/// strict read throws that message.
void expect_one_skipped_row(const std::string& text, bool jsonl, const BadRow& c) {
  const Trace t = jsonl ? mooncake(text) : azure(text);
  // The Azure header is line 1, so its bad row is line 3; Mooncake has no header.
  const int64_t line = jsonl ? 2 : 3;
  const std::string where =
      std::string(jsonl ? "t.jsonl:" : "t.csv:") + std::to_string(line) + ": ";
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[1].prompt_tokens, 30);
  EXPECT_EQ(t.rows_read, 3);
  EXPECT_EQ(t.rows_skipped, 1);
  EXPECT_THAT(t.skipped_by_reason, ElementsAre(Pair(c.reason, 1)));
  ASSERT_EQ(t.problems.size(), 1u);
  EXPECT_EQ(t.problems[0].line, line);
  EXPECT_EQ(t.problems[0].message, where + c.message);
  EXPECT_EQ(strict_error(text, jsonl), where + c.message + " (--strict)");
}

class AzureBadRow : public ::testing::TestWithParam<BadRow> {};

// Row 2 is good, row 3 is the bad one, row 4 is good again: the bad row is skipped and counted,
// and its message names line 3; in strict mode the same message is thrown.
TEST_P(AzureBadRow, SkippedWithLineNumberOrStrictFailure) {
  const BadRow& c = GetParam();
  const std::string text = std::string(kHeader) + "2023-11-16 18:15:46,10,2\n" + c.row + "\n" +
                           "2023-11-16 18:15:48,30,4\n";
  expect_one_skipped_row(text, /*jsonl=*/false, c);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AzureBadRow,
    ::testing::Values(
        BadRow{"non_numeric", "2023-11-16 18:15:47,abc,2", "non-numeric",
               "ContextTokens 'abc' is not a whole number"},
        BadRow{"fractional", "2023-11-16 18:15:47,12.5,2", "non-numeric",
               "ContextTokens '12.5' is not a whole number"},
        BadRow{"negative", "2023-11-16 18:15:47,10,-3", "negative",
               "GeneratedTokens is negative (-3)"},
        BadRow{"zero_prompt", "2023-11-16 18:15:47,0,3", "zero prompt",
               "ContextTokens is 0 (must be >= 1)"},
        BadRow{"empty_field", "2023-11-16 18:15:47,,3", "empty field", "ContextTokens is empty"},
        BadRow{"empty_row", "", "empty row", "empty row"},
        BadRow{"too_few_fields", "2023-11-16 18:15:47,10", "wrong field count",
               "expected 3 fields, got 2"},
        BadRow{"too_many_fields", "2023-11-16 18:15:47,10,2,9", "wrong field count",
               "expected 3 fields, got 4"},
        BadRow{"huge", "2023-11-16 18:15:47,99999999999999999999,2", "out of range",
               "ContextTokens '99999999999999999999' is out of range (max 1000000000)"},
        BadRow{"bad_timestamp", "yesterday,10,2", "bad timestamp",
               "TIMESTAMP 'yesterday' is not 'YYYY-MM-DD HH:MM:SS[.f]' or a number of seconds"},
        BadRow{"bad_month", "2023-13-16 18:15:47,10,2", "bad timestamp",
               "TIMESTAMP '2023-13-16 18:15:47' is not 'YYYY-MM-DD HH:MM:SS[.f]' or a number of "
               "seconds"},
        BadRow{"out_of_order", "2023-11-16 18:15:45.5,10,2", "timestamp out of order",
               "timestamp -0.500 s is earlier than the previous row's 0.000 s (timestamps must "
               "be non-decreasing)"}),
    [](const ::testing::TestParamInfo<BadRow>& info) { return std::string(info.param.name); });

TEST(AzureCsv, CountsEveryBadRowButKeepsTwentyMessages) {
  std::string text = kHeader;
  for (int i = 0; i < 30; ++i) text += "x,1,1\n";
  text += "2023-11-16 18:15:46,5,5\n";
  const Trace t = azure(text);
  EXPECT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.rows_skipped, 30);
  EXPECT_EQ(t.problems.size(), Trace::kMaxProblemsKept);
  EXPECT_EQ(t.problems.back().line, 21);
}

// ---- Mooncake JSONL ---------------------------------------------------------------------------

TEST(MooncakeJsonl, ReadsRowsAndHashIds) {
  const Trace t = mooncake(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 250, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [0]}\n"
      "{\"timestamp\": 250, \"input_length\": 1025, \"output_length\": 9, \"hash_ids\": [0, 1, "
      "7]}\n");
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.format, TraceFormat::kMooncakeJsonl);
  EXPECT_EQ(t.hash_block_tokens, 512);
  EXPECT_EQ(t.requests[1].arrival_ms, 250.0);
  EXPECT_EQ(t.requests[2].prompt_tokens, 1025);
  EXPECT_THAT(t.hashes(t.requests[0]), ElementsAre(0, 1));
  EXPECT_THAT(t.hashes(t.requests[1]), ElementsAre(0));
  EXPECT_THAT(t.hashes(t.requests[2]), ElementsAre(0, 1, 7));
}

TEST(MooncakeJsonl, HashIdsAreOptional) {
  const Trace t = mooncake("{\"timestamp\": 1.5, \"input_length\": 10, \"output_length\": 2}\n");
  ASSERT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.requests[0].hash_count, 0u);
}

TEST(MooncakeJsonl, UnknownKeyWarnsOnceOrFailsWhenStrict) {
  const std::string text =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"model\": \"kimi\"}\n"
      "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 2, \"model\": \"kimi\"}\n";
  const Trace t = mooncake(text);
  EXPECT_EQ(t.requests.size(), 2u);
  EXPECT_THAT(t.warnings, ElementsAre("t.jsonl:1: ignoring unknown key 'model'"));
  EXPECT_EQ(strict_error(text, true), "t.jsonl:1: ignoring unknown key 'model' (--strict)");
}

class MooncakeBadRow : public ::testing::TestWithParam<BadRow> {};

TEST_P(MooncakeBadRow, SkippedWithLineNumberOrStrictFailure) {
  const BadRow& c = GetParam();
  const std::string text =
      std::string("{\"timestamp\": 100, \"input_length\": 10, \"output_length\": 2}\n") + c.row +
      "\n{\"timestamp\": 300, \"input_length\": 30, \"output_length\": 4}\n";
  expect_one_skipped_row(text, /*jsonl=*/true, c);
  EXPECT_EQ(mooncake(text).requests[1].arrival_ms, 200.0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MooncakeBadRow,
    ::testing::Values(
        BadRow{"invalid_json", "{\"timestamp\": 150, \"input_length\": ", "invalid JSON",
               "not valid JSON"},
        BadRow{"not_an_object", "[150, 10, 2]", "invalid JSON", "not a JSON object"},
        BadRow{"empty_row", "   ", "empty row", "empty row"},
        BadRow{"missing_key", "{\"timestamp\": 150, \"input_length\": 10}", "empty field",
               "missing key 'output_length'"},
        BadRow{"string_length",
               "{\"timestamp\": 150, \"input_length\": \"10\", \"output_length\": 2}",
               "non-numeric", "input_length \"10\" is not a whole number"},
        BadRow{"fractional_length",
               "{\"timestamp\": 150, \"input_length\": 10.5, \"output_length\": 2}", "non-numeric",
               "input_length 10.5 is not a whole number"},
        BadRow{"negative_length",
               "{\"timestamp\": 150, \"input_length\": 10, \"output_length\": -1}", "negative",
               "output_length is negative (-1)"},
        BadRow{"negative_timestamp",
               "{\"timestamp\": -5, \"input_length\": 10, \"output_length\": 1}", "negative",
               "timestamp is negative (-5)"},
        BadRow{"string_timestamp",
               "{\"timestamp\": \"noon\", \"input_length\": 10, \"output_length\": 1}",
               "non-numeric", "timestamp \"noon\" is not a number"},
        BadRow{
            "hash_ids_wrong_length",
            "{\"timestamp\": 150, \"input_length\": 513, \"output_length\": 1, \"hash_ids\": [4]}",
            "bad hash_ids", "hash_ids has 1 entries, expected ceil(input_length 513 / 512) = 2"},
        BadRow{
            "hash_ids_negative",
            "{\"timestamp\": 150, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-4]}",
            "bad hash_ids", "hash_ids must be an array of non-negative whole numbers"},
        BadRow{"out_of_order", "{\"timestamp\": 50, \"input_length\": 10, \"output_length\": 1}",
               "timestamp out of order",
               "timestamp -0.050 s is earlier than the previous row's 0.000 s (timestamps must be "
               "non-decreasing)"}),
    [](const ::testing::TestParamInfo<BadRow>& info) { return std::string(info.param.name); });

// ---- files ------------------------------------------------------------------------------------

TEST(ReadTrace, MissingFileAndDirectoryThrow) {
  testing::TempDir dir("read_trace");
  EXPECT_THAT([&] { (void)read_trace(dir.file("nope.csv")); },
              ::testing::ThrowsMessage<Error>(HasSubstr("nope.csv': no such file")));
  EXPECT_THAT([&] { (void)read_trace(dir.path()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("': is a directory")));
}

TEST(ReadTrace, UnreadableFileThrows) {
  testing::TempDir dir("unreadable");
  const std::string path = dir.file("locked.csv");
  testing::write_file(path, std::string(kHeader) + "2023-11-16 18:15:46,10,2\n");
  ::chmod(path.c_str(), 0);
  if (FILE* f = std::fopen(path.c_str(), "rb")) {  // root ignores permissions
    std::fclose(f);
    GTEST_SKIP() << "running with privileges that ignore file permissions (root)";
  }
  EXPECT_THAT([&] { (void)read_trace(path); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot read trace")));
}

TEST(ReadTrace, PicksTheReaderByExtensionOrContent) {
  testing::TempDir dir("formats");
  const std::string json_row = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n";
  testing::write_file(dir.file("a.jsonl"), json_row);
  testing::write_file(dir.file("a.txt"), "\n" + json_row);
  testing::write_file(dir.file("b.txt"), std::string(kHeader) + "2023-11-16 18:15:46,10,2\n");
  EXPECT_EQ(read_trace(dir.file("a.jsonl")).format, TraceFormat::kMooncakeJsonl);
  const Trace sniffed = read_trace(dir.file("a.txt"));
  EXPECT_EQ(sniffed.format, TraceFormat::kMooncakeJsonl);
  EXPECT_EQ(sniffed.rows_skipped, 1);  // the leading blank line is an empty row
  EXPECT_EQ(read_trace(dir.file("b.txt")).format, TraceFormat::kAzureCsv);
}

// ---- the real traces (../shared/traces, stats from traces/SOURCES.md) --------------------------

struct Stats {
  double mean_prompt = 0, mean_output = 0, span_s = 0;
  int64_t max_prompt = 0, min_prompt = INT64_MAX;
};

Stats stats(const Trace& t) {
  Stats s;
  for (const TraceRequest& r : t.requests) {
    s.mean_prompt += static_cast<double>(r.prompt_tokens);
    s.mean_output += static_cast<double>(r.output_tokens);
    s.max_prompt = std::max(s.max_prompt, r.prompt_tokens);
    s.min_prompt = std::min(s.min_prompt, r.prompt_tokens);
  }
  s.mean_prompt /= static_cast<double>(t.requests.size());
  s.mean_output /= static_cast<double>(t.requests.size());
  s.span_s = t.requests.back().arrival_ms / 1000.0;
  return s;
}

TEST(RealTraces, AzureCode) {
  PAGEDKV_REQUIRE_TRACES();
  const Trace t = read_trace((testing::traces_dir() / "AzureLLMInferenceTrace_code.csv").string(),
                             {.strict = true});
  EXPECT_EQ(t.requests.size(), 8819u);
  EXPECT_EQ(t.rows_read, 8819);
  const Stats s = stats(t);
  // SOURCES.md rounds means to 0.1 and the span to 0.1 s.
  EXPECT_NEAR(s.mean_prompt, 2047.8, 0.05);
  EXPECT_NEAR(s.mean_output, 27.9, 0.05);
  EXPECT_NEAR(s.span_s, 3435.9, 0.05);
  EXPECT_EQ(s.min_prompt, 3);
  EXPECT_EQ(s.max_prompt, 7437);
}

TEST(RealTraces, AzureConversation) {
  PAGEDKV_REQUIRE_TRACES();
  const Trace t = read_trace((testing::traces_dir() / "AzureLLMInferenceTrace_conv.csv").string(),
                             {.strict = true});
  EXPECT_EQ(t.requests.size(), 19366u);  // the last row has no newline and still counts
  const Stats s = stats(t);
  EXPECT_NEAR(s.mean_prompt, 1154.7, 0.05);
  EXPECT_NEAR(s.mean_output, 211.1, 0.05);
  EXPECT_NEAR(s.span_s, 3501.7, 0.05);
  EXPECT_EQ(s.min_prompt, 2);
  EXPECT_EQ(s.max_prompt, 14050);
  int64_t within_512 = 0;
  for (const TraceRequest& r : t.requests) within_512 += r.prompt_tokens + r.output_tokens <= 512;
  EXPECT_NEAR(static_cast<double>(within_512) / 19366.0, 0.3183, 5e-5);
}

TEST(RealTraces, MooncakeConversation) {
  PAGEDKV_REQUIRE_TRACES();
  const Trace t = read_trace((testing::traces_dir() / "mooncake_conversation_trace.jsonl").string(),
                             {.strict = true});
  EXPECT_EQ(t.requests.size(), 12031u);
  EXPECT_TRUE(t.warnings.empty());
  const Stats s = stats(t);
  EXPECT_NEAR(s.mean_prompt, 12035.1, 0.05);
  EXPECT_NEAR(s.mean_output, 342.6, 0.05);
  EXPECT_NEAR(s.span_s, 3537.0, 0.05);
  EXPECT_EQ(s.min_prompt, 891);
  EXPECT_EQ(s.max_prompt, 126195);
  // Prefix-block reuse: 288500 references, 182790 distinct ids, 105710 repeats.
  EXPECT_EQ(t.hash_ids.size(), 288500u);
  std::set<int64_t> distinct(t.hash_ids.begin(), t.hash_ids.end());
  EXPECT_EQ(distinct.size(), 182790u);
}

}  // namespace
}  // namespace pagedkv::sim

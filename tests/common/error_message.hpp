#pragma once
// The message of the pagedkv::Error a call throws, for tests that assert on error text
// (EXPECT_THAT(message_of([&] { ... }), HasSubstr("..."))).

#include <string>

#include "pagedkv/error.hpp"

namespace pagedkv::testing {

/// Runs fn; returns the what() of the pagedkv::Error it throws, or "(no exception)". Any other
/// exception propagates (the test fails with it).
inline std::string message_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace pagedkv::testing

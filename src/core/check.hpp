#pragma once
// Private helpers for contract checks at the public boundary. Not installed.

#include <fmt/format.h>

#include "pagedkv/error.hpp"

namespace pagedkv::detail {

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace pagedkv::detail

/// Throws pagedkv::Error with a fmt-formatted message when `cond` is false.
#define PAGEDKV_CHECK(cond, ...)                       \
  do {                                                 \
    if (!(cond)) ::pagedkv::detail::fail(__VA_ARGS__); \
  } while (0)

#pragma once
/// @file error.hpp
/// The one exception type of pagedkv.

#include <stdexcept>
#include <string>

namespace pagedkv {

/// Thrown on contract violations: unknown sequence, double free, a position or block id out of
/// range, a shape or dtype mismatch, an unsupported kernel configuration, a corrupt file.
/// The message names the offending value. Running out of blocks is NOT an error: it is reported
/// as an empty result (see DESIGN.md "Error policy"). A throwing operation changes nothing.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace pagedkv

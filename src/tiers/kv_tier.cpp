#include "pagedkv/tiers/kv_tier.hpp"

namespace pagedkv {

std::string_view tier_medium_name(TierMedium medium) {
  switch (medium) {
    case TierMedium::kHost:
      return "CPU";
    case TierMedium::kDisk:
      return "DISK";
    case TierMedium::kRedis:
      return "REDIS";
  }
  return "?";
}

}  // namespace pagedkv

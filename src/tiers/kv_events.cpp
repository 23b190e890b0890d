#include "pagedkv/tiers/kv_events.hpp"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/redis_tier.hpp"

namespace pagedkv {

namespace {

// One vLLM event for a block that was stored (with its parent and tokens) or removed.
KVEvent block_event(std::string medium, bool stored, BlockHash hash, BlockHash parent_hash,
                    const std::vector<TokenId>& tokens, int32_t block_size) {
  KVEvent k;
  k.medium = std::move(medium);
  k.block_hashes = {hash};
  if (stored) {
    k.type = KVEvent::Type::kBlockStored;
    if (parent_hash != kRootBlockHash) k.parent_block_hash = parent_hash;
    k.token_ids = tokens;
    k.block_size = block_size;
  } else {
    k.type = KVEvent::Type::kBlockRemoved;
  }
  return k;
}

}  // namespace

std::vector<KVEvent> pool_events(std::span<const KVCacheEvent> events, int32_t block_size,
                                 std::string_view medium) {
  std::vector<KVEvent> out;
  out.reserve(events.size());
  for (const KVCacheEvent& e : events) {
    if (e.kind == KVCacheEvent::Kind::kAllCleared) {
      // The pool's reset, after its BlockRemoved events; the tiers keep their blocks, hence
      // the medium (vLLM's AllBlocksCleared has none: it has one pool).
      KVEvent cleared;
      cleared.type = KVEvent::Type::kAllBlocksCleared;
      cleared.medium = std::string(medium);
      out.push_back(std::move(cleared));
      continue;
    }
    out.push_back(block_event(std::string(medium), e.kind == KVCacheEvent::Kind::kStored, e.hash,
                              e.parent_hash, e.tokens, block_size));
  }
  return out;
}

std::vector<KVEvent> tier_events(std::span<const TierEvent> events, int32_t block_size) {
  std::vector<KVEvent> out;
  out.reserve(events.size());
  for (const TierEvent& e : events) {
    out.push_back(block_event(std::string(tier_medium_name(e.medium)), e.stored, e.hash,
                              e.parent_hash, e.tokens, block_size));
  }
  return out;
}

namespace {

nlohmann::json event_json(const KVEvent& e) {
  switch (e.type) {
    case KVEvent::Type::kBlockStored:
      return {{"type", "BlockStored"},
              {"block_hashes", e.block_hashes},
              {"parent_block_hash", e.parent_block_hash ? nlohmann::json(*e.parent_block_hash)
                                                        : nlohmann::json(nullptr)},
              {"token_ids", e.token_ids},
              {"block_size", e.block_size},
              {"lora_id", nullptr},
              {"medium", e.medium}};
    case KVEvent::Type::kBlockRemoved:
      return {{"type", "BlockRemoved"}, {"block_hashes", e.block_hashes}, {"medium", e.medium}};
    case KVEvent::Type::kAllBlocksCleared:
      return {{"type", "AllBlocksCleared"}, {"medium", e.medium}};
  }
  return {};
}

}  // namespace

std::string kv_event_batch_json(double ts, std::span<const KVEvent> events) {
  nlohmann::json list = nlohmann::json::array();
  for (const KVEvent& e : events) list.push_back(event_json(e));
  return nlohmann::json{{"ts", ts}, {"events", std::move(list)}, {"data_parallel_rank", nullptr}}
      .dump();
}

KVEventPublisher::KVEventPublisher(const std::string& path) {
  if (path == "-") {
    out_ = stdout;
    return;
  }
  out_ = std::fopen(path.c_str(), "a");
  if (out_ == nullptr) {
    throw Error(fmt::format("KV events: cannot open '{}' for appending", path));
  }
  owned_ = true;
}

KVEventPublisher::~KVEventPublisher() {
  if (owned_) std::fclose(out_);
}

void KVEventPublisher::publish(std::span<const KVEvent> events) {
  if (events.empty()) return;
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = kv_event_batch_json(ts, events);
  if (std::fprintf(out_, "%s\n", line.c_str()) < 0 || std::fflush(out_) != 0) ++failures_;
  if (stream_ != nullptr && !stream_->xadd("batch", line)) ++failures_;
  ++batches_;
}

}  // namespace pagedkv

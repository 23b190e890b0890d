// Enums, configurations, result types, stats and events of pagedkv._pagedkv.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <string>

#include "bindings.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"

namespace pagedkv::py {

using namespace nb::literals;

static_assert(sizeof(BlockCopy) == 2 * sizeof(int32_t) && alignof(BlockCopy) == alignof(int32_t),
              "BlockCopy must be two packed int32 (src, dst) for the [n, 2] view");

nb::ndarray<nb::numpy, int32_t> copies_view(nb::handle owner, std::vector<BlockCopy>& copies) {
  return view(owner, reinterpret_cast<int32_t*>(copies.data()), {copies.size(), 2});
}

std::vector<TokenId> to_token_ids(const std::vector<int64_t>& values, const char* what) {
  std::vector<TokenId> ids(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    if (v < std::numeric_limits<TokenId>::min() || v > std::numeric_limits<TokenId>::max()) {
      throw nb::value_error((std::string(what) + "[" + std::to_string(i) +
                             "] = " + std::to_string(v) + " does not fit a token id (int32)")
                                .c_str());
    }
    ids[i] = static_cast<TokenId>(v);
  }
  return ids;
}

void check_range(const char* what, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    throw nb::value_error((std::string(what) + " = " + std::to_string(value) + " is outside [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]")
                              .c_str());
  }
}

namespace {

void bind_enums(nb::module_& m) {
  nb::enum_<Admission>(m, "Admission",
                       "Answer of an admission query: OK now, LATER (retry once blocks free "
                       "up), NEVER (can never fit: drop or fail the request).")
      .value("OK", Admission::kOk)
      .value("LATER", Admission::kLater)
      .value("NEVER", Admission::kNever);
  nb::enum_<EvictionKind>(m, "EvictionKind", "Token eviction policy of a manager.")
      .value("NONE", EvictionKind::kNone)
      .value("SLIDING_WINDOW", EvictionKind::kSlidingWindow)
      .value("ATTENTION_SINKS", EvictionKind::kAttentionSinks)
      .value("HEAVY_HITTERS", EvictionKind::kHeavyHitters);
  nb::enum_<KVCacheEvent::Kind>(m, "EventKind",
                                "What happened to a block's prefix-cache registration.")
      .value("STORED", KVCacheEvent::Kind::kStored)
      .value("REMOVED", KVCacheEvent::Kind::kRemoved)
      .value("EVICTED", KVCacheEvent::Kind::kEvicted)
      .value("ALL_CLEARED", KVCacheEvent::Kind::kAllCleared);
}

void bind_configs(nb::module_& m) {
  nb::class_<EvictionPolicyConfig>(m, "EvictionPolicyConfig",
                                   "Token eviction policy parameters (tokens); fields a kind "
                                   "does not use stay 0.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](EvictionPolicyConfig* self, EvictionKind kind, int32_t window, int32_t sinks,
             int32_t recent, int32_t heavy) {
            new (self) EvictionPolicyConfig{kind, window, sinks, recent, heavy};
          },
          "kind"_a, "window"_a = 0, "sinks"_a = 0, "recent"_a = 0, "heavy"_a = 0)
      .def_rw("kind", &EvictionPolicyConfig::kind)
      .def_rw("window", &EvictionPolicyConfig::window)
      .def_rw("sinks", &EvictionPolicyConfig::sinks)
      .def_rw("recent", &EvictionPolicyConfig::recent)
      .def_rw("heavy", &EvictionPolicyConfig::heavy);
  nb::class_<KVCacheManagerConfig>(m, "KVCacheManagerConfig",
                                   "Configuration of a KVCacheManager (checked by its "
                                   "constructor: ValueError naming the field).")
      .def(
          "__init__",
          [](KVCacheManagerConfig* self, int32_t num_blocks, int32_t block_size,
             bool enable_prefix_caching, int32_t num_host_blocks, double watermark,
             int64_t max_model_len, const EvictionPolicyConfig& eviction, bool enable_events) {
            new (self) KVCacheManagerConfig{num_blocks,      block_size,   enable_prefix_caching,
                                            num_host_blocks, watermark,    max_model_len,
                                            eviction,        enable_events};
          },
          "num_blocks"_a, "block_size"_a = 16, nb::kw_only(), "enable_prefix_caching"_a = false,
          "num_host_blocks"_a = 0, "watermark"_a = 0.0, "max_model_len"_a = 0,
          "eviction"_a = EvictionPolicyConfig{}, "enable_events"_a = false)
      .def_rw("num_blocks", &KVCacheManagerConfig::num_blocks)
      .def_rw("block_size", &KVCacheManagerConfig::block_size)
      .def_rw("enable_prefix_caching", &KVCacheManagerConfig::enable_prefix_caching)
      .def_rw("num_host_blocks", &KVCacheManagerConfig::num_host_blocks)
      .def_rw("watermark", &KVCacheManagerConfig::watermark)
      .def_rw("max_model_len", &KVCacheManagerConfig::max_model_len)
      .def_rw("eviction", &KVCacheManagerConfig::eviction)
      .def_rw("enable_events", &KVCacheManagerConfig::enable_events);
  nb::class_<AddOptions>(m, "AddOptions", "How add_sequence admits a prompt (tokens).")
      .def(
          "__init__",
          [](AddOptions* self, uint64_t extra_key, int64_t max_new_tokens,
             int64_t first_chunk_tokens) {
            check_range("max_new_tokens", max_new_tokens, 0, std::numeric_limits<int64_t>::max());
            check_range("first_chunk_tokens", first_chunk_tokens, -1,
                        std::numeric_limits<int64_t>::max());
            new (self) AddOptions{extra_key, max_new_tokens, first_chunk_tokens};
          },
          nb::kw_only(), "extra_key"_a = 0, "max_new_tokens"_a = 0, "first_chunk_tokens"_a = -1)
      .def_ro("extra_key", &AddOptions::extra_key)
      .def_ro("max_new_tokens", &AddOptions::max_new_tokens)
      .def_ro("first_chunk_tokens", &AddOptions::first_chunk_tokens);
}

// Properties of a result type: numpy views of its vectors, made when read (see view()).
template <class T, class F>
auto array_of(F get) {
  return [get](nb::handle self) {
    T& r = nb::cast<T&>(self);
    return view(self, get(r));
  };
}

void bind_batch_metadata(nb::module_& m) {
  using BM = BatchMetadata;
  auto seq_lens = array_of<BM>([](BM & b) -> auto& { return b.padded.context_lens; });
  auto query_start = array_of<BM>([](BM & b) -> auto& { return b.query_start; });
  nb::class_<BM>(m, "BatchMetadata", "Metadata of one batch step (see _pagedkv.pyi).")
      .def_ro("block_size", &BM::block_size)
      .def_prop_ro("num_seqs", [](const BM& b) { return b.padded.num_seqs; })
      .def_prop_ro("max_blocks_per_seq", [](const BM& b) { return b.padded.max_blocks_per_seq; })
      .def_prop_ro("num_blocks", [](const BM& b) { return b.padded.num_blocks; })
      .def_prop_ro("block_tables",
                   [](nb::handle self) {
                     PaddedBlockTables& p = nb::cast<BM&>(self).padded;
                     return view(self, p.block_tables.data(),
                                 {static_cast<size_t>(p.num_seqs),
                                  static_cast<size_t>(p.max_blocks_per_seq)});
                   })
      .def_prop_ro("seq_lens", seq_lens)
      .def_prop_ro("context_lens", seq_lens)
      .def_prop_ro("paged_kv_indptr", array_of<BM>([](BM & b) -> auto& { return b.csr.indptr; }))
      .def_prop_ro("paged_kv_indices", array_of<BM>([](BM & b) -> auto& { return b.csr.indices; }))
      .def_prop_ro("paged_kv_last_page_len",
                   array_of<BM>([](BM & b) -> auto& { return b.csr.last_page_len; }))
      .def_prop_ro("slot_mapping", array_of<BM>([](BM & b) -> auto& { return b.slot_mapping; }))
      .def_prop_ro("query_start_loc", query_start)
      .def_prop_ro("qo_indptr", query_start);
}

void bind_results(nb::module_& m) {
  nb::class_<AppendResult>(m, "AppendResult",
                           "slots: [n] int64 slot of each new token; copies: [k, 2] int32 "
                           "(src, dst) blocks to copy (all layers) before writing.")
      .def_prop_ro("slots",
                   array_of<AppendResult>([](AppendResult & r) -> auto& { return r.slots; }))
      .def_prop_ro(
          "copies",
          [](nb::handle self) { return copies_view(self, nb::cast<AppendResult&>(self).copies); })
      // len(copies) without making the array (a per-step check in an engine's loop).
      .def_prop_ro("num_copies", [](const AppendResult& r) { return r.copies.size(); });
  nb::class_<AddResult>(m, "AddResult",
                        "num_computed_tokens: prefix hits (tokens); slots: [len - hits] int64; "
                        "copies: [0, 2] int32.")
      .def_ro("num_computed_tokens", &AddResult::num_computed_tokens)
      .def_prop_ro("slots",
                   array_of<AddResult>([](AddResult & r) -> auto& { return r.append.slots; }))
      .def_prop_ro("copies",
                   [](nb::handle self) {
                     return copies_view(self, nb::cast<AddResult&>(self).append.copies);
                   })
      .def_prop_ro("num_copies", [](const AddResult& r) { return r.append.copies.size(); });
  nb::class_<PrefixLookup>(m, "PrefixLookup", "What add_sequence would share now.")
      .def_ro("num_computed_tokens", &PrefixLookup::num_computed_tokens)
      .def_prop_ro("blocks",
                   array_of<PrefixLookup>([](PrefixLookup & r) -> auto& { return r.blocks; }));
  nb::class_<SwapResult>(m, "SwapResult", "copies: [n, 2] int32 (src, dst) block pairs.")
      .def_prop_ro("copies", [](nb::handle self) {
        return copies_view(self, nb::cast<SwapResult&>(self).copies);
      });
  nb::class_<PreemptedSequence>(m, "PreemptedSequence", "What a recompute preemption left.")
      .def_ro("seq", &PreemptedSequence::seq)
      .def_ro("num_tokens", &PreemptedSequence::num_tokens)
      .def_prop_ro("tokens", array_of<PreemptedSequence>(
                                 [](PreemptedSequence & r) -> auto& { return r.tokens; }))
      .def_ro("extra_key", &PreemptedSequence::extra_key);
  nb::class_<KeptTokens>(m, "KeptTokens", "Kept sets of a batch, CSR.")
      .def_prop_ro("indptr", array_of<KeptTokens>([](KeptTokens & k) -> auto& { return k.indptr; }))
      .def_prop_ro("slots", array_of<KeptTokens>([](KeptTokens & k) -> auto& { return k.slots; }))
      .def_prop_ro("positions",
                   array_of<KeptTokens>([](KeptTokens & k) -> auto& { return k.positions; }));
  bind_batch_metadata(m);
}

void bind_stats(nb::module_& m) {
  nb::class_<KVCacheStats>(m, "KVCacheStats", "Counters of a manager (blocks unless _tokens).")
      .def_ro("total_blocks", &KVCacheStats::total_blocks)
      .def_ro("free_blocks", &KVCacheStats::free_blocks)
      .def_ro("used_blocks", &KVCacheStats::used_blocks)
      .def_ro("cached_blocks", &KVCacheStats::cached_blocks)
      .def_ro("usage", &KVCacheStats::usage)
      .def_ro("num_sequences", &KVCacheStats::num_sequences)
      .def_ro("num_swapped_sequences", &KVCacheStats::num_swapped_sequences)
      .def_ro("prefix_query_tokens", &KVCacheStats::prefix_query_tokens)
      .def_ro("prefix_hit_tokens", &KVCacheStats::prefix_hit_tokens)
      .def_ro("prefix_hits", &KVCacheStats::prefix_hits)
      .def_ro("prefix_misses", &KVCacheStats::prefix_misses)
      .def_ro("prefix_evictions", &KVCacheStats::prefix_evictions)
      .def_ro("prefix_cached_entries", &KVCacheStats::prefix_cached_entries)
      .def_ro("preemptions", &KVCacheStats::preemptions)
      .def_ro("swapped_out_blocks", &KVCacheStats::swapped_out_blocks)
      .def_ro("swapped_in_blocks", &KVCacheStats::swapped_in_blocks)
      .def_ro("host_total_blocks", &KVCacheStats::host_total_blocks)
      .def_ro("host_used_blocks", &KVCacheStats::host_used_blocks)
      .def_ro("released_blocks", &KVCacheStats::released_blocks)
      .def_ro("evicted_tokens", &KVCacheStats::evicted_tokens)
      .def_prop_ro("prefix_hit_rate", &KVCacheStats::prefix_hit_rate);
  nb::class_<KVCacheEvent>(m, "KVCacheEvent",
                           "One prefix-cache event: kind, block, hash; STORED ones also carry "
                           "parent_hash, extra_key and the block's token ids; ALL_CLEARED "
                           "(the last event of reset_prefix_cache) has block -1 and hash 0.")
      .def_ro("kind", &KVCacheEvent::kind)
      .def_ro("block", &KVCacheEvent::block)
      .def_ro("hash", &KVCacheEvent::hash)
      .def_ro("parent_hash", &KVCacheEvent::parent_hash)
      .def_ro("extra_key", &KVCacheEvent::extra_key)
      .def_ro("tokens", &KVCacheEvent::tokens)
      .def("__repr__", [](const KVCacheEvent& e) {
        return "KVCacheEvent(" + std::string(event_kind_name(e.kind)) +
               ", block=" + std::to_string(e.block) + ", hash=" + std::to_string(e.hash) + ")";
      });
  m.def(
      "block_hash",
      [](uint64_t parent, const std::vector<int64_t>& tokens, uint64_t extra_key) {
        return block_hash(parent, to_token_ids(tokens, "tokens"), extra_key);
      },
      "parent"_a, "tokens"_a, "extra_key"_a = 0,
      "Content key of a full block: XXH3-64 of (parent key, extra key, token ids).");
  m.attr("ROOT_BLOCK_HASH") = kRootBlockHash;
  m.attr("PADDING_SEQ") = kPaddingSeq;
  m.attr("NO_BLOCK") = KVCacheManager::kNoBlock;
  m.attr("MAX_TOKENS_PER_CALL") = KVCacheManager::kMaxTokensPerCall;
}

}  // namespace

void bind_types(nb::module_& m) {
  bind_enums(m);
  bind_configs(m);
  bind_results(m);
  bind_stats(m);
}

}  // namespace pagedkv::py

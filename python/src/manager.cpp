// KVCacheManager for Python: each method mirrors the C++ one (kv_cache_manager.hpp). Results
// are the C++ result types, whose arrays are numpy views made when read (types.cpp); running
// out of blocks is None, as the C++ empty optional; contract violations raise pagedkv.ContractError
// (module.cpp).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

#include "bindings.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::py {

using namespace nb::literals;

namespace {

using Mgr = KVCacheManager;
using Ints = std::vector<int64_t>;
constexpr int64_t kMaxCall = KVCacheManager::kMaxTokensPerCall;

// A bad configuration is a bad argument (ValueError): the manager has no state yet.
KVCacheManager checked(const KVCacheManagerConfig& config) {
  try {
    return KVCacheManager(config);
  } catch (const pagedkv::Error& e) {
    throw nb::value_error(e.what());
  }
}

void check_count(const char* what, int64_t n) { check_range(what, n, 0, kMaxCall); }

void bind_sequences(nb::class_<PyManager>& c) {
  c.def(
       "add_sequence",
       [](PyManager& self, SeqId seq, const Ints& prompt, const AddOptions& options) {
         const std::vector<TokenId> ids = to_token_ids(prompt, "prompt");
         return self.released([&](Mgr& m) { return m.add_sequence(seq, ids, options); });
       },
       "seq"_a, "prompt"_a = Ints{}, "options"_a = AddOptions{})
      .def(
          "can_add_sequence",
          [](PyManager& self, const Ints& prompt, const AddOptions& options) {
            const std::vector<TokenId> ids = to_token_ids(prompt, "prompt");
            return self.released([&](Mgr& m) { return m.can_add_sequence(ids, options); });
          },
          "prompt"_a, "options"_a = AddOptions{})
      .def(
          "lookup_prefix",
          [](PyManager& self, const Ints& prompt, uint64_t extra_key) {
            const std::vector<TokenId> ids = to_token_ids(prompt, "prompt");
            return self.released([&](Mgr& m) { return m.lookup_prefix(ids, extra_key); });
          },
          "prompt"_a, "extra_key"_a = 0)
      .def(
          "commit",
          [](PyManager& self, SeqId seq, int64_t num_tokens) {
            check_range("num_tokens", num_tokens, 0, INT64_MAX);
            return self.released([&](Mgr& m) { return m.commit(seq, num_tokens); });
          },
          "seq"_a, "num_tokens"_a)
      .def("num_committed_tokens",
           [](PyManager& self, SeqId seq) {
             return self.held([&](Mgr& m) { return m.num_committed_tokens(seq); });
           })
      .def(
          "truncate",
          [](PyManager& self, SeqId seq, int64_t num_tokens) {
            check_range("num_tokens", num_tokens, 0, INT64_MAX);
            self.released([&](Mgr& m) { m.truncate(seq, num_tokens); });
          },
          "seq"_a, "num_tokens"_a)
      .def("free_sequence",
           [](PyManager& self, SeqId seq) { self.released([&](Mgr& m) { m.free_sequence(seq); }); })
      .def(
          "fork",
          [](PyManager& self, SeqId parent, SeqId child) {
            self.held([&](Mgr& m) { m.fork(parent, child); });
          },
          "parent"_a, "child"_a);
}

void bind_append(nb::class_<PyManager>& c) {
  c.def(
       "append_slots",
       [](PyManager& self, SeqId seq, int64_t n) {
         check_count("n", n);
         return self.held([&](Mgr& m) { return m.append_slots(seq, n); });
       },
       "seq"_a, "n"_a)
      .def(
          "append_tokens",
          [](PyManager& self, SeqId seq, const Ints& tokens) {
            check_count("len(tokens)", static_cast<int64_t>(tokens.size()));
            const std::vector<TokenId> ids = to_token_ids(tokens, "tokens");
            return self.released([&](Mgr& m) { return m.append_tokens(seq, ids); });
          },
          "seq"_a, "tokens"_a)
      .def(
          "can_append",
          [](PyManager& self, SeqId seq, int64_t n, int64_t lookahead) {
            check_count("n", n);
            check_count("num_lookahead_slots", lookahead);
            return self.held([&](Mgr& m) { return m.can_append(seq, n, lookahead); });
          },
          "seq"_a, "n"_a, "num_lookahead_slots"_a = 0)
      .def(
          "append_admission",
          [](PyManager& self, SeqId seq, int64_t n, int64_t lookahead) {
            check_count("n", n);
            check_count("num_lookahead_slots", lookahead);
            return self.held([&](Mgr& m) { return m.append_admission(seq, n, lookahead); });
          },
          "seq"_a, "n"_a, "num_lookahead_slots"_a = 0)
      .def(
          "blocks_needed_to_append",
          [](PyManager& self, SeqId seq, int64_t n, int64_t lookahead) {
            check_count("n", n);
            check_count("num_lookahead_slots", lookahead);
            return self.held([&](Mgr& m) { return m.blocks_needed_to_append(seq, n, lookahead); });
          },
          "seq"_a, "n"_a, "num_lookahead_slots"_a = 0);
}

void bind_batch(nb::class_<PyManager>& c) {
  c.def(
       "batch_metadata",
       [](PyManager& self, const std::vector<SeqId>& seqs, const Ints& num_new_tokens) {
         if (seqs.size() != num_new_tokens.size()) {
           throw nb::value_error(
               ("len(seqs) = " + std::to_string(seqs.size()) +
                " differs from len(num_new_tokens) = " + std::to_string(num_new_tokens.size()))
                   .c_str());
         }
         for (size_t i = 0; i < num_new_tokens.size(); ++i) {
           if (num_new_tokens[i] < 0) {
             throw nb::value_error(("num_new_tokens[" + std::to_string(i) +
                                    "] = " + std::to_string(num_new_tokens[i]) + " < 0")
                                       .c_str());
           }
         }
         return self.released([&](Mgr& m) { return m.batch_metadata(seqs, num_new_tokens); });
       },
       "seqs"_a, "num_new_tokens"_a)
      .def(
          "kept_tokens",
          [](PyManager& self, const std::vector<SeqId>& seqs) {
            return self.released([&](Mgr& m) { return m.kept_tokens(seqs); });
          },
          "seqs"_a)
      .def(
          "accumulate_attention",
          [](PyManager& self, SeqId seq, const std::vector<float>& weights) {
            self.released([&](Mgr& m) { m.accumulate_attention(seq, weights); });
          },
          "seq"_a, "weights"_a);
}

void bind_swap(nb::class_<PyManager>& c) {
  c.def("can_swap_out",
        [](PyManager& self, SeqId seq) {
          return self.held([&](Mgr& m) { return m.can_swap_out(seq); });
        })
      .def("swap_out",
           [](PyManager& self, SeqId seq) {
             return self.released([&](Mgr& m) { return m.swap_out(seq); });
           })
      .def("swap_out_admission",
           [](PyManager& self, SeqId seq) {
             return self.held([&](Mgr& m) { return m.swap_out_admission(seq); });
           })
      .def(
          "can_swap_in",
          [](PyManager& self, SeqId seq, int64_t lookahead) {
            check_count("num_lookahead_slots", lookahead);
            return self.held([&](Mgr& m) { return m.can_swap_in(seq, lookahead); });
          },
          "seq"_a, "num_lookahead_slots"_a = 0)
      .def(
          "swap_in_admission",
          [](PyManager& self, SeqId seq, int64_t lookahead) {
            check_count("num_lookahead_slots", lookahead);
            return self.held([&](Mgr& m) { return m.swap_in_admission(seq, lookahead); });
          },
          "seq"_a, "num_lookahead_slots"_a = 0)
      .def(
          "swap_in",
          [](PyManager& self, SeqId seq, int64_t lookahead) {
            check_count("num_lookahead_slots", lookahead);
            return self.released([&](Mgr& m) { return m.swap_in(seq, lookahead); });
          },
          "seq"_a, "num_lookahead_slots"_a = 0)
      .def("is_swapped",
           [](PyManager& self, SeqId seq) {
             return self.held([&](Mgr& m) { return m.is_swapped(seq); });
           })
      .def("preempt",
           [](PyManager& self, SeqId seq) {
             return self.released([&](Mgr& m) { return m.preempt(seq); });
           })
      .def("reset_prefix_cache", [](PyManager& self) {
        return self.released([](Mgr& m) { return m.reset_prefix_cache(); });
      });
}

void bind_queries(nb::class_<PyManager>& c) {
  c.def("num_tokens",
        [](PyManager& self, SeqId seq) {
          return self.held([&](Mgr& m) { return m.num_tokens(seq); });
        })
      .def("block_table",
           [](PyManager& self, SeqId seq) {
             std::vector<BlockId> t = self.held([&](Mgr& m) {
               std::span<const BlockId> s = m.block_table(seq);
               return std::vector<BlockId>(s.begin(), s.end());
             });
             return to_numpy(std::move(t));
           })
      .def("has_sequence",
           [](PyManager& self, SeqId seq) {
             return self.held([&](Mgr& m) { return m.has_sequence(seq); });
           })
      .def("__contains__",
           [](PyManager& self, SeqId seq) {
             return self.held([&](Mgr& m) { return m.has_sequence(seq); });
           })
      .def("sequences",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.sequences(); }); })
      .def("num_sequences",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.num_sequences(); }); })
      .def("num_free_blocks",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.num_free_blocks(); }); })
      .def("num_total_blocks",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.num_total_blocks(); }); })
      .def("watermark_blocks",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.watermark_blocks(); }); })
      .def("min_blocks_held",
           [](PyManager& self, int64_t num_tokens) {
             check_range("num_tokens", num_tokens, 0, INT64_MAX);
             return self.held([&](Mgr& m) { return m.min_blocks_held(num_tokens); });
           })
      .def("usage", [](PyManager& self) { return self.held([](Mgr& m) { return m.usage(); }); })
      .def("stats", [](PyManager& self) { return self.held([](Mgr& m) { return m.stats(); }); })
      .def("take_events",
           [](PyManager& self) { return self.held([](Mgr& m) { return m.take_events(); }); })
      .def_prop_ro("config",
                   [](PyManager& self) { return self.held([](Mgr& m) { return m.config(); }); })
      .def("check_invariants",
           [](PyManager& self) { self.released([](Mgr& m) { m.check_invariants(); }); });
}

}  // namespace

PyManager::PyManager(const KVCacheManagerConfig& config) : manager_(checked(config)) {}

void bind_manager(nb::module_& m) {
  nb::class_<PyManager> c(m, "KVCacheManager",
                          "Block manager of one paged KV cache (pagedkv::KVCacheManager).");
  c.def(nb::init<const KVCacheManagerConfig&>(), "config"_a);
  bind_sequences(c);
  bind_append(c);
  bind_batch(c);
  bind_swap(c);
  bind_queries(c);
}

}  // namespace pagedkv::py

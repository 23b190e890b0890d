// End-to-end generation with the built-in model: the time of one decode step (one new token of
// one sequence) at a given context length, for each cache mode. Built as bench_generate by
// benchmarks/generate.cmake when the model layer (pagedkv_model) is part of the build.
//
// Benchmarks (names are parsed by benchmarks/summarize.py):
//   BM_DecodeStep/<mode>/pos:P   mean time of the steps that produce positions P .. P+15
//     none             no cache: every step recomputes the whole history (P+1 tokens) through
//                      the model, attention by the same fast paged kernel (model/kv_backend.hpp)
//     contiguous_view  K/V in a contiguous [seqs, kv heads, max_len, head_dim] cache, attention by
//                      the fast kernel over its contiguous view (contiguous_paged_view.hpp): the
//                      fair peer
//     paged            KVCacheManager + HostKVCache, block_size 16, paged_decode_attention
//     contiguous_ref   the model layer's contiguous mode: ReferenceKVCache + the textbook
//                      reference_attention (double precision, for correctness, not speed)
// Model: builtin_config() (dim 512, 4 layers, 8 heads / 4 kv heads, head 64, vocab 1024) with
// seq_len raised to 4096 so that 2048 positions fit; seeded random weights. Threads: as
// `pagedkv generate` (model::set_threads, model::MatmulThreads): products of at least 4 M
// multiply-adds get the cores, smaller ones and attention one thread, unless
// OPENBLAS_NUM_THREADS / OMP_NUM_THREADS are set. Positions 128, 512, 1024, 2048 by default;
// PAGEDKV_BENCH_FULL=1 adds 256 and 4000.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/checkpoint.hpp"
#include "model/kv_backend.hpp"
#include "model/llama.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"
#include "pagedkv/storage/host_buffer.hpp"

namespace pagedkv {
namespace {

using model::CacheMode;
using model::KVBackend;
using model::KVBackendConfig;

constexpr int32_t kMaxLen = 4096;
constexpr int32_t kSteps = 16;  // decode steps timed per run
constexpr int32_t kBlockSize = 16;

/// Contiguous cache attended by the fast kernel through contiguous_paged_view: per layer K and V
/// [max_seqs, num_kv_heads, max_len, head_dim] fp32, sequence s in row slot_of(s).
class ContiguousViewBackend final : public KVBackend {
 public:
  ContiguousViewBackend(const KVBackendConfig& c, int32_t max_seqs, int32_t max_len)
      : c_(c), max_seqs_(max_seqs), max_len_(max_len) {
    params_ = {.num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads, .head_dim = c.head_dim};
    shape_ = {.num_seqs = max_seqs,
              .num_kv_heads = c.num_kv_heads,
              .max_len = max_len,
              .head_dim = c.head_dim};
    const int64_t bytes = contiguous_kv_elements(shape_) * static_cast<int64_t>(sizeof(float));
    for (int32_t l = 0; l < c.num_layers; ++l) {
      k_.emplace_back(bytes);  // the paged pool's allocator: only the layout differs
      v_.emplace_back(bytes);
    }
  }
  [[nodiscard]] CacheMode mode() const override { return CacheMode::kContiguous; }
  void add_sequence(SeqId seq) override {
    if (slots_.contains(seq) || static_cast<int32_t>(slots_.size()) == max_seqs_) {
      throw Error("contiguous_view: cannot add sequence " + std::to_string(seq));
    }
    int32_t slot = 0;
    while (used_slot(slot)) ++slot;
    slots_[seq] = {slot, 0};
  }
  void free_sequence(SeqId seq) override { slots_.erase(seq); }
  [[nodiscard]] int64_t num_tokens(SeqId seq) const override { return slots_.at(seq).len; }

  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override {
    seqs_.assign(seqs.begin(), seqs.end());
    n_new_.assign(n_new.begin(), n_new.end());
    tables_.num_seqs = static_cast<int32_t>(seqs.size());
    tables_.max_blocks_per_seq = 1;
    tables_.block_size = shape_.max_len;  // one block per sequence row (contiguous_paged_view)
    tables_.num_blocks = shape_.num_seqs;
    tables_.block_tables.clear();
    tables_.context_lens.clear();
    query_start_.assign(1, 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Entry& e = slots_.at(seqs[i]);
      if (e.len + n_new[i] > max_len_) throw Error("contiguous_view: max_len exceeded");
      tables_.block_tables.push_back(e.slot);  // block = the sequence's row of the cache
      tables_.context_lens.push_back(static_cast<int32_t>(e.len + n_new[i]));
      query_start_.push_back(query_start_.back() + static_cast<int32_t>(n_new[i]));
    }
  }

  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override {
    const KVLayerView view = contiguous_paged_view(shape_, k_[layer].data(), v_[layer].data());
    const int64_t row = static_cast<int64_t>(c_.num_kv_heads) * c_.head_dim;
    int64_t t = 0;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      const Entry& e = slots_.at(seqs_[i]);
      for (int64_t j = 0; j < n_new_[i]; ++j, ++t) {
        for (int32_t h = 0; h < c_.num_kv_heads; ++h) {
          const int64_t dst = view.offset(e.slot, h, e.len + j);
          const int64_t src = t * row + static_cast<int64_t>(h) * c_.head_dim;
          std::copy_n(k.data() + src, c_.head_dim, k_[layer].as<float>() + dst);
          std::copy_n(v.data() + src, c_.head_dim, v_[layer].as<float>() + dst);
        }
      }
    }
    paged_prefill_attention(params_, view, tables_.view(), query_start_, q, out);
  }

  void end_step() override {
    for (size_t i = 0; i < seqs_.size(); ++i) slots_.at(seqs_[i]).len += n_new_[i];
  }
  [[nodiscard]] int64_t bytes_in_use() const override {
    int64_t tokens = 0;
    for (const auto& [seq, e] : slots_) tokens += e.len;
    return 2 * tokens * c_.num_layers * c_.num_kv_heads * c_.head_dim * 4;
  }

 private:
  struct Entry {
    int32_t slot;
    int64_t len;
  };
  [[nodiscard]] bool used_slot(int32_t slot) const {
    for (const auto& [seq, e] : slots_) {
      if (e.slot == slot) return true;
    }
    return false;
  }
  KVBackendConfig c_;
  int32_t max_seqs_;
  int32_t max_len_;
  AttentionParams params_;
  ContiguousKVShape shape_;
  std::vector<HostBuffer> k_, v_;  // [layers] fp32 [max_seqs * heads * max_len * dim]
  std::map<SeqId, Entry> slots_;
  std::vector<SeqId> seqs_;
  std::vector<int64_t> n_new_;
  PaddedBlockTables tables_;
  std::vector<int32_t> query_start_;
};

enum class Mode { kNone, kContiguousView, kPaged, kContiguousRef };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kNone:
      return "none";
    case Mode::kContiguousView:
      return "contiguous_view";
    case Mode::kPaged:
      return "paged";
    case Mode::kContiguousRef:
      return "contiguous_ref";
  }
  return "?";
}

model::LlamaModel& the_model() {
  static model::LlamaModel m = [] {
    model::LlamaConfig c = model::builtin_config();
    c.seq_len = kMaxLen;
    return model::LlamaModel(model::random_weights(c, /*seed=*/1));
  }();
  return m;
}

TokenId token_at(int64_t pos) { return static_cast<TokenId>((pos * 7 + 3) % 1000 + 1); }

std::unique_ptr<KVBackend> make_backend(Mode mode, int32_t positions) {
  model::LlamaModel& m = the_model();
  const int32_t blocks =
      static_cast<int32_t>(blocks_for_tokens(positions + kSteps + 1, kBlockSize)) + 1;
  const KVBackendConfig c = m.backend_config(kBlockSize, blocks);
  switch (mode) {
    case Mode::kNone:
      return model::make_kv_backend(CacheMode::kNone, c);
    case Mode::kPaged:
      return model::make_kv_backend(CacheMode::kPaged, c);
    case Mode::kContiguousRef:
      return model::make_kv_backend(CacheMode::kContiguous, c);
    case Mode::kContiguousView:
      return std::make_unique<ContiguousViewBackend>(c, /*max_seqs=*/1, kMaxLen);
  }
  return nullptr;
}

void BM_DecodeStep(benchmark::State& state, Mode mode, int32_t positions) {
  model::LlamaModel& m = the_model();
  std::unique_ptr<KVBackend> backend = make_backend(mode, positions);
  const SeqId seq = 0;
  const std::vector<SeqId> seqs{seq};
  backend->add_sequence(seq);
  std::vector<TokenId> history;
  for (int64_t p = 0; p < positions; ++p) history.push_back(token_at(p));
  if (backend->caches()) {  // prefill the context, untimed
    const std::vector<int64_t> n{positions};
    (void)m.forward(*backend, {seqs, n, history}, false);
  }
  for (auto _ : state) {
    history.push_back(token_at(static_cast<int64_t>(history.size())));
    std::span<const float> logits;
    if (backend->caches()) {
      const std::vector<int64_t> n{1};
      logits = m.forward(*backend, {seqs, n, std::span(history).last(1)}, false);
    } else {  // recompute: the whole history through the model
      const std::vector<int64_t> n{static_cast<int64_t>(history.size())};
      logits = m.forward(*backend, {seqs, n, history}, false);
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["kv_bytes"] = static_cast<double>(backend->bytes_in_use());
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

void register_all() {
  std::vector<int32_t> positions = {128, 512, 1024, 2048};
  if (env_flag("PAGEDKV_BENCH_FULL")) positions = {128, 256, 512, 1024, 2048, 4000};
  for (int32_t p : positions) {
    for (Mode mode : {Mode::kNone, Mode::kContiguousView, Mode::kPaged, Mode::kContiguousRef}) {
      const std::string name =
          std::string("BM_DecodeStep/") + mode_name(mode) + "/pos:" + std::to_string(p);
      benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStep, mode, p)
          ->Iterations(kSteps)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The thread policy of `pagedkv generate` (see model::set_threads), unless set from outside.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  pagedkv::model::set_threads(std::getenv("OPENBLAS_NUM_THREADS") ? 0 : static_cast<int>(cores),
                              std::getenv("OMP_NUM_THREADS") ? 0 : 1);
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    pagedkv::the_model().set_matmul_threads({.max_threads = static_cast<int32_t>(cores)});
  }
  pagedkv::model::LlamaConfig config = pagedkv::model::builtin_config();
  config.seq_len = pagedkv::kMaxLen;
  benchmark::AddCustomContext("pagedkv_model", "built-in, " + config.describe());
  pagedkv::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

#include "model/checkpoint.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

namespace {

constexpr int64_t kHeaderBytes = 7 * sizeof(int32_t);

/// a * b, or -1 when it does not fit in int64 (every operand here is >= 0).
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
  return r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return -1;
  return r;
}

/// Float offsets of every array in file order; -1 in `total` on overflow.
struct Layout {
  int64_t token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, rope, wcls,
      total;
};

Layout layout_of(const LlamaConfig& c) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const int64_t kv_dim = c.kv_dim();
  Layout l{};
  int64_t at = 0;
  auto take = [&](int64_t& field, int64_t n) {
    field = at;
    at = (at < 0 || n < 0) ? -1 : add(at, n);
  };
  take(l.token_embedding, mul(vocab, dim));
  take(l.rms_att, mul(layers, dim));
  take(l.wq, mul(layers, mul(dim, dim)));
  take(l.wk, mul(layers, mul(kv_dim, dim)));
  take(l.wv, mul(layers, mul(kv_dim, dim)));
  take(l.wo, mul(layers, mul(dim, dim)));
  take(l.rms_ffn, mul(layers, dim));
  take(l.w1, mul(layers, mul(hidden, dim)));
  take(l.w2, mul(layers, mul(dim, hidden)));
  take(l.w3, mul(layers, mul(hidden, dim)));
  take(l.rms_final, dim);
  // Legacy freq_cis_real and freq_cis_imag, [seq_len, head_size / 2] each.
  take(l.rope, mul(c.seq_len, c.head_size()));
  take(l.wcls, c.shared_classifier ? 0 : mul(vocab, dim));
  l.total = at;
  return l;
}

[[noreturn]] void fail_file(const std::string& path, const std::string& problem) {
  throw Error(fmt::format("model file {}: {}", path, problem));
}

/// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
/// 2014): tiny, seedable with anything (0 included), identical on every platform.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1).
  float symmetric() { return static_cast<float>((next() >> 40) * 0x1.0p-24 * 2.0 - 1.0); }
};

}  // namespace

int64_t LlamaConfig::num_parameters() const {
  const Layout l = layout_of(*this);
  return l.total - (l.wcls - l.rope);
}

std::string LlamaConfig::describe() const {
  return fmt::format(
      "dim {}, hidden {}, {} layers, {} heads / {} kv heads (head_size {}), vocab {}, "
      "seq_len {}, {} classifier",
      dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_size(), vocab_size, seq_len,
      shared_classifier ? "shared" : "separate");
}

void validate_config(const LlamaConfig& c, const std::string& what) {
  const std::array<std::pair<const char*, int32_t>, 7> fields{{{"dim", c.dim},
                                                               {"hidden_dim", c.hidden_dim},
                                                               {"n_layers", c.n_layers},
                                                               {"n_heads", c.n_heads},
                                                               {"n_kv_heads", c.n_kv_heads},
                                                               {"vocab_size", c.vocab_size},
                                                               {"seq_len", c.seq_len}}};
  for (const auto& [name, value] : fields) {
    if (value < 1) {
      throw Error(fmt::format("{}: {} is {}; every dimension must be >= 1", what, name, value));
    }
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(fmt::format("{}: n_heads {} is not a multiple of n_kv_heads {}", what, c.n_heads,
                            c.n_kv_heads));
  }
  if (c.dim % c.n_heads != 0) {
    throw Error(fmt::format("{}: dim {} is not a multiple of n_heads {}", what, c.dim, c.n_heads));
  }
  if (c.head_size() % 2 != 0) {
    throw Error(
        fmt::format("{}: head_size dim / n_heads = {} is odd; rotary embedding rotates "
                    "pairs of dimensions",
                    what, c.head_size()));
  }
  // Every float offset must fit in int64 and every byte count too (x 4), so the file-length
  // comparison and all later address math are exact.
  const int64_t total = layout_of(c).total;
  if (total < 0 || total > std::numeric_limits<int64_t>::max() / 8) {
    throw Error(fmt::format("{}: dimensions too large ({}): the weights would not be addressable",
                            what, c.describe()));
  }
}

int64_t weights_floats(const LlamaConfig& config) { return layout_of(config).total; }

LlamaWeights::LlamaWeights(const LlamaConfig& config, std::vector<float> data)
    : config_(config), data_(std::move(data)) {
  validate_config(config_, "weights");
  const Layout l = layout_of(config_);
  if (static_cast<int64_t>(data_.size()) != l.total) {
    throw Error(
        fmt::format("weights: buffer has {} floats, the config needs {}", data_.size(), l.total));
  }
  const float* base = data_.data();
  token_embedding = base + l.token_embedding;
  rms_att = base + l.rms_att;
  wq = base + l.wq;
  wk = base + l.wk;
  wv = base + l.wv;
  wo = base + l.wo;
  rms_ffn = base + l.rms_ffn;
  w1 = base + l.w1;
  w2 = base + l.w2;
  w3 = base + l.w3;
  rms_final = base + l.rms_final;
  wcls = config_.shared_classifier ? token_embedding : base + l.wcls;
}

LlamaWeights load_checkpoint(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail_file(path, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file(path, fmt::format("cannot open ({})", std::strerror(errno)));
  const auto size_u = std::filesystem::file_size(path, ec);
  if (ec) fail_file(path, fmt::format("cannot read its size ({})", ec.message()));
  const auto file_bytes = static_cast<int64_t>(size_u);
  if (file_bytes < kHeaderBytes) {
    fail_file(path, fmt::format("truncated: {} bytes, shorter than the {}-byte header (7 int32: "
                                "dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, "
                                "seq_len)",
                                file_bytes, kHeaderBytes));
  }
  std::array<int32_t, 7> h{};
  in.read(reinterpret_cast<char*>(h.data()), kHeaderBytes);
  if (!in) fail_file(path, "cannot read the header");

  LlamaConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  // A negative vocab_size flags a separate classifier (llama2.c export convention).
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] == std::numeric_limits<int32_t>::min() ? 0 : std::abs(h[5]);
  c.seq_len = h[6];
  validate_config(c, fmt::format("model file {}", path));

  const int64_t floats = weights_floats(c);
  const int64_t expected = kHeaderBytes + floats * 4;
  if (file_bytes != expected) {
    fail_file(path, fmt::format("{}: {} bytes, but its header ({}) implies {} bytes",
                                file_bytes < expected ? "truncated" : "length mismatch", file_bytes,
                                c.describe(), expected));
  }
  std::vector<float> data(static_cast<size_t>(floats));
  in.read(reinterpret_cast<char*>(data.data()), floats * 4);
  if (!in) fail_file(path, "read error while loading the weights");
  return LlamaWeights(c, std::move(data));
}

void save_checkpoint(const LlamaWeights& weights, const std::string& path) {
  const LlamaConfig& c = weights.config();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("cannot write model file {} ({})", path, std::strerror(errno)));
  const std::array<int32_t, 7> h{c.dim,        c.hidden_dim,
                                 c.n_layers,   c.n_heads,
                                 c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                                 c.seq_len};
  out.write(reinterpret_cast<const char*>(h.data()), kHeaderBytes);
  out.write(reinterpret_cast<const char*>(weights.token_embedding), weights_floats(c) * 4);
  if (!out) throw Error(fmt::format("cannot write model file {}", path));
}

LlamaConfig builtin_config() {
  LlamaConfig c;
  c.dim = 512;
  c.hidden_dim = 1376;  // Llama's rule: 2/3 x 4 x dim = 1365, rounded up to a multiple of 32
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.vocab_size = 1024;
  c.seq_len = 512;
  // Separate: with random weights a tied classifier scores the current token's own embedding
  // highest, and greedy decoding repeats one token forever.
  c.shared_classifier = false;
  return c;
}

LlamaWeights random_weights(const LlamaConfig& config, uint64_t seed) {
  validate_config(config, "random weights");
  const Layout l = layout_of(config);
  std::vector<float> data(static_cast<size_t>(l.total));
  SplitMix64 rng{seed};
  auto fill = [&](int64_t begin, int64_t end, float scale) {
    for (int64_t i = begin; i < end; ++i) data[static_cast<size_t>(i)] = rng.symmetric() * scale;
  };
  auto ones = [&](int64_t begin, int64_t end) {
    std::fill(data.begin() + begin, data.begin() + end, 1.0f);
  };
  const float in_dim = 1.0f / std::sqrt(static_cast<float>(config.dim));
  const float in_hidden = 1.0f / std::sqrt(static_cast<float>(config.hidden_dim));
  fill(l.token_embedding, l.rms_att, 1.0f);
  ones(l.rms_att, l.wq);
  fill(l.wq, l.rms_ffn, in_dim);  // wq, wk, wv, wo all read dim-wide inputs
  ones(l.rms_ffn, l.w1);
  fill(l.w1, l.w2, in_dim);
  fill(l.w2, l.w3, in_hidden);
  fill(l.w3, l.rms_final, in_dim);
  ones(l.rms_final, l.rope);
  // The legacy RoPE tables stay zero (never read); a separate classifier reads dim-wide input.
  fill(l.wcls, l.total, in_dim);
  return LlamaWeights(config, std::move(data));
}

uint64_t LlamaWeights::content_hash() const {
  return XXH3_64bits(data_.data(), data_.size() * sizeof(float));
}

}  // namespace pagedkv::model

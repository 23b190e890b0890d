// libFuzzer target: the llama2.c checkpoint reader (src/model/checkpoint.hpp). Input: 1 flag
// byte, the 28-byte header, then weights. With flag bit 0 the weights are padded or cut to the
// length the header implies (when that is small), so the fuzzer also reaches accepted files;
// those run one forward step on the paged cache. The reader may only throw pagedkv::Error with
// one line naming the file, and must never allocate for a size the file does not hold (the
// fuzz job runs with -malloc_limit_mb, which turns such an allocation into a crash).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "model/checkpoint.hpp"
#include "model/kv_backend.hpp"
#include "model/llama.hpp"
#include "pagedkv/error.hpp"

namespace {

constexpr size_t kHeaderBytes = 28;
/// Larger implied files are not synthesized: they would only slow the fuzzer down.
constexpr int64_t kMaxSynthesizedBytes = 1 << 20;

/// One forward step of two tokens through the paged backend: a header the reader accepts must
/// describe a model the forward pass can run (or reject with pagedkv::Error).
void run_one_step(pagedkv::model::LlamaWeights weights) {
  using namespace pagedkv;
  const model::LlamaConfig c = weights.config();
  if (c.seq_len < 2 || c.n_layers > 4) return;
  model::LlamaModel llama(std::move(weights));
  try {
    std::unique_ptr<model::KVBackend> backend =
        model::make_kv_backend(model::CacheMode::kPaged, llama.backend_config(4, 2));
    backend->add_sequence(0);
    const SeqId seqs[] = {0};
    const int64_t n_new[] = {2};
    const TokenId tokens[] = {0, c.vocab_size - 1};
    const std::span<const float> logits = llama.forward(*backend, {seqs, n_new, tokens}, false);
    PAGEDKV_FUZZ_CHECK(logits.size() == static_cast<size_t>(c.vocab_size), "logits size %zu",
                       logits.size());
  } catch (const Error&) {
    // e.g. a head size no attention kernel supports: rejected by name, which is fine.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagedkv;
  static fuzz::ScratchFile file("checkpoint");
  fuzz::ByteReader in(data, size);
  const uint8_t flags = in.byte();
  std::string bytes(in.rest());
  if ((flags & 1) != 0 && bytes.size() >= kHeaderBytes) {
    int32_t h[7];
    std::memcpy(h, bytes.data(), kHeaderBytes);
    model::LlamaConfig c{.dim = h[0],
                         .hidden_dim = h[1],
                         .n_layers = h[2],
                         .n_heads = h[3],
                         .n_kv_heads = h[4],
                         // INT32_MIN has no positive counterpart: the reader rejects it as 0.
                         .vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]),
                         .seq_len = h[6],
                         .shared_classifier = h[5] > 0};
    try {
      model::validate_config(c, "fuzz");
      const int64_t implied = static_cast<int64_t>(kHeaderBytes) + 4 * model::weights_floats(c);
      if (implied <= kMaxSynthesizedBytes) bytes.resize(static_cast<size_t>(implied), '\0');
    } catch (const Error&) {
      // An invalid header stays as it is: the reader must reject it.
    }
  }
  const std::string& path = file.write(bytes);
  try {
    model::LlamaWeights w = model::load_checkpoint(path);
    const model::LlamaConfig& c = w.config();
    PAGEDKV_FUZZ_CHECK(c.dim >= 1 && c.n_heads >= 1 && c.n_kv_heads >= 1 && c.vocab_size >= 1,
                       "accepted config %s", c.describe().c_str());
    PAGEDKV_FUZZ_CHECK((w.wcls == w.token_embedding) == c.shared_classifier, "classifier");
    run_one_step(std::move(w));
  } catch (const Error& e) {
    const std::string msg = e.what();
    PAGEDKV_FUZZ_CHECK(msg.find('\n') == std::string::npos, "multi-line message: %s", msg.c_str());
    PAGEDKV_FUZZ_CHECK(msg.find(path) != std::string::npos, "message does not name the file: %s",
                       msg.c_str());
  }
  return 0;
}

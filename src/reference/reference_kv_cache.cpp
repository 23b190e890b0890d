#include "pagedkv/reference/reference_kv_cache.hpp"

#include "core/check.hpp"

namespace pagedkv {

ReferenceKVCache::ReferenceKVCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim)
    : num_layers_(num_layers), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  PAGEDKV_CHECK(num_layers >= 1, "ReferenceKVCache: num_layers must be >= 1, got {}", num_layers);
  PAGEDKV_CHECK(num_kv_heads >= 1, "ReferenceKVCache: num_kv_heads must be >= 1, got {}",
                num_kv_heads);
  PAGEDKV_CHECK(head_dim >= 1, "ReferenceKVCache: head_dim must be >= 1, got {}", head_dim);
}

void ReferenceKVCache::add_sequence(SeqId seq) {
  PAGEDKV_CHECK(!seqs_.contains(seq), "ReferenceKVCache::add_sequence: sequence {} exists", seq);
  seqs_.emplace(seq, std::vector<Layer>(static_cast<size_t>(num_layers_)));
}

void ReferenceKVCache::free_sequence(SeqId seq) {
  PAGEDKV_CHECK(seqs_.erase(seq) == 1, "ReferenceKVCache::free_sequence: unknown sequence {}", seq);
}

const std::vector<ReferenceKVCache::Layer>& ReferenceKVCache::get(SeqId seq, int32_t layer) const {
  const auto it = seqs_.find(seq);
  PAGEDKV_CHECK(it != seqs_.end(), "ReferenceKVCache: unknown sequence {}", seq);
  PAGEDKV_CHECK(layer >= 0 && layer < num_layers_,
                "ReferenceKVCache: layer {} out of range [0, {})", layer, num_layers_);
  return it->second;
}

void ReferenceKVCache::append(SeqId seq, int32_t layer, std::span<const float> k,
                              std::span<const float> v) {
  // get() checks seq and layer; the const_cast is safe because this method is non-const.
  auto& layers = const_cast<std::vector<Layer>&>(get(seq, layer));
  const size_t token_elems = static_cast<size_t>(num_kv_heads_) * head_dim_;
  PAGEDKV_CHECK(k.size() == v.size(), "ReferenceKVCache::append: k has {} elements but v has {}",
                k.size(), v.size());
  PAGEDKV_CHECK(k.size() % token_elems == 0,
                "ReferenceKVCache::append: {} elements is not a multiple of num_kv_heads x "
                "head_dim = {}",
                k.size(), token_elems);
  Layer& l = layers[static_cast<size_t>(layer)];
  l.k.insert(l.k.end(), k.begin(), k.end());
  l.v.insert(l.v.end(), v.begin(), v.end());
}

int64_t ReferenceKVCache::num_tokens(SeqId seq, int32_t layer) const {
  const Layer& l = get(seq, layer)[static_cast<size_t>(layer)];
  return static_cast<int64_t>(l.k.size()) / (static_cast<int64_t>(num_kv_heads_) * head_dim_);
}

std::span<const float> ReferenceKVCache::keys(SeqId seq, int32_t layer) const {
  return get(seq, layer)[static_cast<size_t>(layer)].k;
}

std::span<const float> ReferenceKVCache::values(SeqId seq, int32_t layer) const {
  return get(seq, layer)[static_cast<size_t>(layer)].v;
}

int64_t ReferenceKVCache::bytes_in_use() const {
  int64_t bytes = 0;
  for (const auto& [seq, layers] : seqs_) {
    for (const Layer& l : layers) {
      bytes += static_cast<int64_t>(l.k.size() + l.v.size()) * static_cast<int64_t>(sizeof(float));
    }
  }
  return bytes;
}

}  // namespace pagedkv

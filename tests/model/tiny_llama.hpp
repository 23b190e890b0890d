#pragma once
// The small random Llama of the generate tests: dim 32, 2 layers, 4 heads over 2 kv heads (GQA
// group 2), vocabulary 300, untied classifier (tied random weights would just repeat the last
// token).

#include "model/llama.hpp"

namespace pagedkv::model::testing {

inline LlamaConfig tiny_llama_config(int32_t seq_len = 64) {
  LlamaConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 300;
  c.seq_len = seq_len;
  c.shared_classifier = false;
  return c;
}

}  // namespace pagedkv::model::testing

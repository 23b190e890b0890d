// Downstream use of an installed pagedkv: allocate slots, write K/V, run paged decode attention
// and compare with the reference. Exit code 0 only when the two agree.
#include <cmath>
#include <cstdio>
#include <pagedkv/pagedkv.hpp>
#include <vector>

int main() {
  pagedkv::KVCacheManager manager({.num_blocks = 4, .block_size = 2});
  pagedkv::HostKVCache cache(
      {.num_layers = 1, .num_blocks = 4, .block_size = 2, .num_kv_heads = 1, .head_dim = 2});
  manager.add_sequence(0);
  const std::vector<float> k{1, 0, 0, 1, 1, 1}, v{1, 2, 3, 4, 5, 6};  // 3 tokens, head_dim 2
  auto slots = manager.append_slots(0, 3);
  if (!slots) return 1;
  cache.write(0, slots->slots, k, v);
  const std::vector<pagedkv::SeqId> seqs{0};
  const std::vector<int64_t> n_new{0};
  pagedkv::BatchMetadata meta = manager.batch_metadata(seqs, n_new);
  const pagedkv::AttentionParams params{.num_heads = 1, .num_kv_heads = 1, .head_dim = 2};
  const std::vector<float> q{0.5f, -0.5f};
  std::vector<float> out(2), ref(2);
  pagedkv::paged_decode_attention(params, cache.layer(0), meta.padded.view(), q, out);
  pagedkv::reference_attention(params, q, k, v, 3, ref);
  const double err = std::fabs(out[0] - ref[0]) + std::fabs(out[1] - ref[1]);
  std::printf("consumer: paged %.6f %.6f reference %.6f %.6f\n", out[0], out[1], ref[0], ref[1]);
  return err < 1e-5 ? 0 : 1;
}

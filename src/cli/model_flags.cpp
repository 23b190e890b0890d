#include "cli/model_flags.hpp"

#include "pagedkv/dtype.hpp"

namespace pagedkv::cli {

void add_model_flags(CLI::App& sub, ModelFlags& flags, const ModelFlagsHelp& help) {
  auto symbol = [&](const char* s) { return help.formula_symbols ? std::string(" ") + s : ""; };
  sub.add_option("--preset", flags.preset, "model preset: " + sim::preset_names())
      ->capture_default_str();
  sub.add_option("--layers", flags.layers, "override: transformer layers" + symbol("L"))
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--kv-heads", flags.kv_heads, "override: K/V heads" + symbol("H_kv"))
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--head-dim", flags.head_dim, "override: head dimension" + symbol("D"))
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--dtype", flags.dtype,
                 "override: KV dtype (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8)");
  sub.add_option("--max-context", flags.max_context, help.max_context)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
}

sim::ModelPreset resolve_model(const ModelFlags& flags) {
  sim::ModelOverrides ov;
  ov.num_layers = flags.layers;
  ov.num_kv_heads = flags.kv_heads;
  ov.head_dim = flags.head_dim;
  if (flags.dtype) ov.dtype = parse_dtype(*flags.dtype);
  ov.max_context = flags.max_context;
  ov.sliding_window = flags.sliding_window;
  ov.num_local_layers = flags.local_layers;
  return sim::apply_overrides(sim::find_preset(flags.preset), ov);
}

}  // namespace pagedkv::cli

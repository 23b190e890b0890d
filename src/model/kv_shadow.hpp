#pragma once
/// @file kv_shadow.hpp
/// Teacher-forced error of a KV storage dtype on a model's real keys and values: a backend that
/// runs a primary cache (the one the model reads) and, beside it, one paged cache per shadow
/// dtype, each fed the very q/k/v rows the primary gets. The shadows' attention outputs are
/// compared with the primary's and thrown away, so the model never sees them and every step's
/// inputs stay those of the primary run: the error measured is the storage format's alone, not
/// the drift of a run that diverged (`pagedkv generate --kv-nmse`, docs/quantization.md).
///
/// NMSE (normalized mean squared error) of a shadow over every attend() call of the run:
///   sum over all output elements of (out_shadow - out_primary)^2 / sum of out_primary^2.

#include <memory>
#include <vector>

#include "model/kv_backend.hpp"

namespace pagedkv::model {

/// One shadow dtype's error so far. Units: none (ratios of sums of squares).
struct ShadowError {
  DType dtype = DType::kF32;
  double sum_sq_error = 0;      ///< sum of (out_shadow - out_primary)^2
  double sum_sq_reference = 0;  ///< sum of out_primary^2
  double max_abs_error = 0;     ///< largest |out_shadow - out_primary|
  int64_t elements = 0;         ///< output elements compared
  /// sum_sq_error / sum_sq_reference; 0 when nothing was compared or the reference is all 0.
  [[nodiscard]] double nmse() const;
};

/// A KVBackend forwarding every call to `primary` and to one CPU paged backend per dtype in
/// `shadow_dtypes` (geometry `config`, dtype replaced), comparing their attention outputs.
/// mode(), num_tokens() and bytes_in_use() are the primary's.
/// Errors: throws pagedkv::Error if primary is null, a shadow dtype repeats, or as
/// make_kv_backend for the shadows' geometry.
class ShadowKVBackend final : public KVBackend {
 public:
  ShadowKVBackend(std::unique_ptr<KVBackend> primary, const KVBackendConfig& config,
                  const std::vector<DType>& shadow_dtypes);

  [[nodiscard]] CacheMode mode() const override { return primary_->mode(); }
  void add_sequence(SeqId seq) override;
  void free_sequence(SeqId seq) override;
  [[nodiscard]] int64_t num_tokens(SeqId seq) const override { return primary_->num_tokens(seq); }
  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override;
  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override;
  void end_step() override;
  [[nodiscard]] int64_t bytes_in_use() const override { return primary_->bytes_in_use(); }
  [[nodiscard]] std::vector<GroupKVUsage> group_usage() const override {
    return primary_->group_usage();
  }

  /// Per shadow, in the order given to the constructor.
  [[nodiscard]] const std::vector<ShadowError>& errors() const { return errors_; }

 private:
  std::unique_ptr<KVBackend> primary_;
  std::vector<std::unique_ptr<KVBackend>> shadows_;
  std::vector<ShadowError> errors_;
  std::vector<float> scratch_;
};

}  // namespace pagedkv::model

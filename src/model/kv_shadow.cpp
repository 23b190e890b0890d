#include "model/kv_shadow.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

double ShadowError::nmse() const {
  return sum_sq_reference > 0 ? sum_sq_error / sum_sq_reference : 0.0;
}

ShadowKVBackend::ShadowKVBackend(std::unique_ptr<KVBackend> primary, const KVBackendConfig& config,
                                 const std::vector<DType>& shadow_dtypes)
    : primary_(std::move(primary)) {
  if (!primary_) throw Error("kv shadow: the primary backend is null");
  for (size_t i = 0; i < shadow_dtypes.size(); ++i) {
    const DType d = shadow_dtypes[i];
    if (std::find(shadow_dtypes.begin(), shadow_dtypes.begin() + static_cast<ptrdiff_t>(i), d) !=
        shadow_dtypes.begin() + static_cast<ptrdiff_t>(i)) {
      throw Error(fmt::format("kv shadow: dtype {} given twice", dtype_name(d)));
    }
    KVBackendConfig c = config;
    c.kv_dtype = d;
    shadows_.push_back(make_kv_backend(CacheMode::kPaged, c, Device::kCpu));
    errors_.push_back(ShadowError{.dtype = d});
  }
}

void ShadowKVBackend::add_sequence(SeqId seq) {
  primary_->add_sequence(seq);
  for (auto& s : shadows_) s->add_sequence(seq);
}

void ShadowKVBackend::free_sequence(SeqId seq) {
  primary_->free_sequence(seq);
  for (auto& s : shadows_) s->free_sequence(seq);
}

void ShadowKVBackend::begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) {
  primary_->begin_step(seqs, n_new);
  for (auto& s : shadows_) s->begin_step(seqs, n_new);
}

void ShadowKVBackend::attend(int32_t layer, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, std::span<float> out) {
  primary_->attend(layer, q, k, v, out);
  scratch_.resize(out.size());
  for (size_t i = 0; i < shadows_.size(); ++i) {
    shadows_[i]->attend(layer, q, k, v, scratch_);
    ShadowError& e = errors_[i];
    for (size_t j = 0; j < out.size(); ++j) {
      const double ref = out[j];
      const double err = static_cast<double>(scratch_[j]) - ref;
      e.sum_sq_error += err * err;
      e.sum_sq_reference += ref * ref;
      // Written so that a NaN output is kept (std::max would drop it).
      if (!(std::abs(err) <= e.max_abs_error)) e.max_abs_error = std::abs(err);
    }
    e.elements += static_cast<int64_t>(out.size());
  }
}

void ShadowKVBackend::end_step() {
  primary_->end_step();
  for (auto& s : shadows_) s->end_step();
}

}  // namespace pagedkv::model

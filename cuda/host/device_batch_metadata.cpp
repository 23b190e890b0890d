// DeviceBatchMetadata: fixed-capacity device buffers for a decode step's metadata (graph
// capture), pinned staging for asynchronous uploads, device-side CSR / slot-mapping builders.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/check.hpp"
#include "cuda/host/cuda_check.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/cuda/device_batch_metadata.hpp"

namespace pagedkv::cuda {

namespace {

// Element offsets inside the buffers (int32 units for tables_ and scan_).
struct Layout {
  int64_t table_entries;  // max_seqs * max_blocks_per_seq
  int64_t seqs;           // max_seqs
  // tables_: [block_tables | context_lens]
  [[nodiscard]] int64_t context_lens() const { return table_entries; }
  [[nodiscard]] int64_t tables_ints() const { return table_entries + seqs; }
  // staging: [block_tables | context_lens | pad to 8 bytes | slot_mapping]
  [[nodiscard]] int64_t staging_slots_offset() const { return (tables_ints() * 4 + 7) / 8 * 8; }
  // scan_: [query_start (seqs+1) | indptr (seqs+1) | last_page_len (seqs) | counts (seqs+1) |
  //         indices (table_entries)]
  [[nodiscard]] int64_t query_start() const { return 0; }
  [[nodiscard]] int64_t indptr() const { return seqs + 1; }
  [[nodiscard]] int64_t last_page_len() const { return 2 * (seqs + 1); }
  [[nodiscard]] int64_t counts() const { return 3 * seqs + 2; }
  [[nodiscard]] int64_t indices() const { return 4 * seqs + 3; }
  [[nodiscard]] int64_t scan_ints() const { return 4 * seqs + 3 + table_entries; }
};

Layout layout_of(const DeviceBatchCapacity& c) {
  return {int64_t{c.max_seqs} * c.max_blocks_per_seq, c.max_seqs};
}

}  // namespace

DeviceBatchMetadata::DeviceBatchMetadata(const DeviceBatchCapacity& capacity)
    : capacity_(capacity) {
  constexpr const char* kFn = "DeviceBatchMetadata";
  PAGEDKV_CHECK(capacity.max_seqs >= 1, "{}: max_seqs must be >= 1, got {}", kFn,
                capacity.max_seqs);
  PAGEDKV_CHECK(capacity.max_blocks_per_seq >= 1, "{}: max_blocks_per_seq must be >= 1, got {}",
                kFn, capacity.max_blocks_per_seq);
  PAGEDKV_CHECK(capacity.max_tokens >= 1, "{}: max_tokens must be >= 1, got {}", kFn,
                capacity.max_tokens);
  const Layout lay = layout_of(capacity);
  PAGEDKV_CHECK(lay.scan_ints() <= INT32_MAX,
                "{}: {} sequences x {} blocks exceed 2^31 - 1 table entries", kFn,
                capacity.max_seqs, capacity.max_blocks_per_seq);
  require_device();
  tables_ = DeviceBuffer(lay.tables_ints() * 4);
  slots_ = DeviceBuffer(capacity.max_tokens * 8);
  scan_ = DeviceBuffer(lay.scan_ints() * 4);
  scan_.zero();
  cub_temp_bytes_ = std::max<int64_t>(detail::scan_temp_bytes(capacity.max_seqs + 1), 1);
  cub_temp_ = DeviceBuffer(cub_temp_bytes_);
  staging_ = PinnedHostBuffer(lay.staging_slots_offset() + capacity.max_tokens * 8);
  cudaEvent_t event = nullptr;
  PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  staging_done_ = event;
  // Start as an all-padding batch: contexts 0, tables -1, slots -1.
  upload(BatchMetadata{}, nullptr);
  synchronize(nullptr);
}

DeviceBatchMetadata::~DeviceBatchMetadata() {
  if (staging_done_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(staging_done_));
}

DeviceBatchMetadata::DeviceBatchMetadata(DeviceBatchMetadata&& other) noexcept
    : capacity_(other.capacity_),
      num_seqs_(other.num_seqs_),
      num_slots_(other.num_slots_),
      block_size_(other.block_size_),
      num_blocks_(other.num_blocks_),
      tables_(std::move(other.tables_)),
      slots_(std::move(other.slots_)),
      scan_(std::move(other.scan_)),
      cub_temp_(std::move(other.cub_temp_)),
      cub_temp_bytes_(other.cub_temp_bytes_),
      staging_(std::move(other.staging_)),
      staging_done_(std::exchange(other.staging_done_, nullptr)) {}

DeviceBatchMetadata& DeviceBatchMetadata::operator=(DeviceBatchMetadata&& other) noexcept {
  if (this != &other) {
    if (staging_done_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(staging_done_));
    capacity_ = other.capacity_;
    num_seqs_ = other.num_seqs_;
    num_slots_ = other.num_slots_;
    block_size_ = other.block_size_;
    num_blocks_ = other.num_blocks_;
    tables_ = std::move(other.tables_);
    slots_ = std::move(other.slots_);
    scan_ = std::move(other.scan_);
    cub_temp_ = std::move(other.cub_temp_);
    cub_temp_bytes_ = other.cub_temp_bytes_;
    staging_ = std::move(other.staging_);
    staging_done_ = std::exchange(other.staging_done_, nullptr);
  }
  return *this;
}

void DeviceBatchMetadata::upload(const BatchMetadata& meta, Stream stream) {
  constexpr const char* kFn = "DeviceBatchMetadata::upload";
  const PaddedBlockTables& padded = meta.padded;
  PAGEDKV_CHECK(padded.num_seqs >= 0 && padded.num_seqs <= capacity_.max_seqs,
                "{}: {} sequences exceed the capacity of {}", kFn, padded.num_seqs,
                capacity_.max_seqs);
  PAGEDKV_CHECK(padded.num_seqs == 0 || (padded.max_blocks_per_seq >= 0 &&
                                         padded.max_blocks_per_seq <= capacity_.max_blocks_per_seq),
                "{}: max_blocks_per_seq {} exceeds the capacity of {}", kFn,
                padded.max_blocks_per_seq, capacity_.max_blocks_per_seq);
  PAGEDKV_CHECK(static_cast<int64_t>(padded.block_tables.size()) ==
                        int64_t{padded.num_seqs} * padded.max_blocks_per_seq &&
                    static_cast<int64_t>(padded.context_lens.size()) == padded.num_seqs,
                "{}: padded tables hold {} entries and {} context lengths for {} sequences x {} "
                "blocks",
                kFn, padded.block_tables.size(), padded.context_lens.size(), padded.num_seqs,
                padded.max_blocks_per_seq);
  const auto num_slots = static_cast<int64_t>(meta.slot_mapping.size());
  PAGEDKV_CHECK(num_slots <= capacity_.max_tokens, "{}: {} slots exceed the capacity of {}", kFn,
                num_slots, capacity_.max_tokens);
  // The geometry travels with the tables into tables(), where attention checks it against the
  // cache; the two copies a BatchMetadata holds must agree.
  PAGEDKV_CHECK(
      meta.block_size == 0 || padded.block_size == 0 || meta.block_size == padded.block_size,
      "{}: meta.block_size {} != meta.padded.block_size {}", kFn, meta.block_size,
      padded.block_size);
  const int32_t block_size = padded.block_size != 0 ? padded.block_size : meta.block_size;

  // The previous upload's copies must have left the staging buffer before it is rewritten.
  PAGEDKV_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(staging_done_)));
  const Layout lay = layout_of(capacity_);
  auto* tables = reinterpret_cast<int32_t*>(staging_.data());
  std::fill_n(tables, lay.table_entries, -1);
  for (int32_t i = 0; i < padded.num_seqs; ++i) {
    std::memcpy(tables + int64_t{i} * capacity_.max_blocks_per_seq,
                padded.block_tables.data() + int64_t{i} * padded.max_blocks_per_seq,
                static_cast<size_t>(padded.max_blocks_per_seq) * 4);
  }
  int32_t* ctx = tables + lay.context_lens();
  std::fill_n(ctx, lay.seqs, 0);
  std::copy(padded.context_lens.begin(), padded.context_lens.end(), ctx);
  auto* slots = reinterpret_cast<int64_t*>(staging_.data() + lay.staging_slots_offset());
  std::fill_n(slots, capacity_.max_tokens, int64_t{-1});
  std::copy(meta.slot_mapping.begin(), meta.slot_mapping.end(), slots);

  const auto s = static_cast<cudaStream_t>(stream);
  tables_.upload(staging_.data(), lay.tables_ints() * 4, 0, stream);
  slots_.upload(slots, capacity_.max_tokens * 8, 0, stream);
  PAGEDKV_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(staging_done_), s));
  num_seqs_ = padded.num_seqs;
  num_slots_ = num_slots;
  block_size_ = block_size;
  num_blocks_ = padded.num_blocks;
}

BlockTableView DeviceBatchMetadata::tables() const {
  const Layout lay = layout_of(capacity_);
  return {tables_.as<const int32_t>(),
          tables_.as<const int32_t>() + lay.context_lens(),
          capacity_.max_seqs,
          capacity_.max_blocks_per_seq,
          block_size_,
          num_blocks_};
}

BlockTableView DeviceBatchMetadata::active_tables() const {
  BlockTableView view = tables();
  view.num_seqs = num_seqs_;
  return view;
}

void DeviceBatchMetadata::check_uploaded_block_size(const char* fn, int32_t block_size) const {
  PAGEDKV_CHECK(block_size_ == 0 || block_size == block_size_,
                "{}: block_size {} but the uploaded tables were built for block_size {}", fn,
                block_size, block_size_);
}

const int64_t* DeviceBatchMetadata::slot_mapping() const { return slots_.as<const int64_t>(); }
const int32_t* DeviceBatchMetadata::query_start() const {
  return scan_.as<const int32_t>() + layout_of(capacity_).query_start();
}
const int32_t* DeviceBatchMetadata::csr_indptr() const {
  return scan_.as<const int32_t>() + layout_of(capacity_).indptr();
}
const int32_t* DeviceBatchMetadata::csr_indices() const {
  return scan_.as<const int32_t>() + layout_of(capacity_).indices();
}
const int32_t* DeviceBatchMetadata::csr_last_page_len() const {
  return scan_.as<const int32_t>() + layout_of(capacity_).last_page_len();
}

void DeviceBatchMetadata::build_csr(int32_t block_size, Stream stream) {
  PAGEDKV_CHECK(block_size >= 1, "DeviceBatchMetadata::build_csr: block_size must be >= 1, got {}",
                block_size);
  check_uploaded_block_size("DeviceBatchMetadata::build_csr", block_size);
  const Layout lay = layout_of(capacity_);
  int32_t* scan = scan_.as<int32_t>();
  detail::MetadataBuffers m;
  m.block_tables = tables_.as<const int32_t>();
  m.context_lens = tables_.as<const int32_t>() + lay.context_lens();
  m.max_seqs = capacity_.max_seqs;
  m.stride = capacity_.max_blocks_per_seq;
  m.counts = scan + lay.counts();
  m.cub_temp = cub_temp_.data();
  m.cub_temp_bytes = cub_temp_bytes_;
  detail::launch_build_csr(m, block_size, scan + lay.indptr(), scan + lay.indices(),
                           scan + lay.last_page_len(), stream);
}

void DeviceBatchMetadata::build_slot_mapping(const int32_t* num_new_tokens, int32_t block_size,
                                             Stream stream) {
  constexpr const char* kFn = "DeviceBatchMetadata::build_slot_mapping";
  PAGEDKV_CHECK(block_size >= 1, "{}: block_size must be >= 1, got {}", kFn, block_size);
  check_uploaded_block_size(kFn, block_size);
  PAGEDKV_CHECK(num_new_tokens != nullptr, "{}: num_new_tokens is null", kFn);
  const Layout lay = layout_of(capacity_);
  int32_t* scan = scan_.as<int32_t>();
  detail::MetadataBuffers m;
  m.block_tables = tables_.as<const int32_t>();
  m.context_lens = tables_.as<const int32_t>() + lay.context_lens();
  m.max_seqs = capacity_.max_seqs;
  m.stride = capacity_.max_blocks_per_seq;
  m.counts = scan + lay.counts();
  m.cub_temp = cub_temp_.data();
  m.cub_temp_bytes = cub_temp_bytes_;
  detail::launch_build_slot_mapping(m, num_new_tokens, block_size, scan + lay.query_start(),
                                    slots_.as<int64_t>(), capacity_.max_tokens, stream);
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA

#pragma once
/// @file disk_tier.hpp
/// The local-disk tier: values in fixed-size slots of one preallocated file, an in-memory index
/// rebuilt from the slot headers when the file is opened again, LRU eviction over the slots.
///
/// Source: vLLM / LMCache's local disk backend (one record per key in a bounded local store,
/// LRU), SGLang HiCache's storage tier (host -> local storage); slot checksums: xxHash XXH3-64.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagedkv/tiers/kv_tier.hpp"

namespace pagedkv {

namespace test_hooks {
struct DiskTierFaults;  // tests/tiers/test_disk_tier.cpp: injects pwrite/pread errors
}  // namespace test_hooks

/// Configuration of a DiskTier. Units: bytes.
struct DiskTierConfig {
  std::string path;             ///< the file; created if missing (its directory must exist)
  int64_t budget_bytes = 0;     ///< slot space: num_slots = budget_bytes / slot_bytes (>= 1)
  int64_t max_value_bytes = 0;  ///< largest value stored, in [1, DiskTier::kMaxValueBytes]
  bool direct_io = false;       ///< open with O_DIRECT (bypasses the page cache)
};

/// A KVTier in one local file of fixed-size slots, one value per slot.
///
/// File layout (little-endian): a kFileHeaderBytes header at offset 0 ("PKVF", format version,
/// slot_bytes, num_slots, XXH3-64 of those), then num_slots slots of slot_bytes =
/// round_up(kSlotHeaderBytes + max_value_bytes, 4096), slot i at kFileHeaderBytes + i *
/// slot_bytes. A slot's kSlotHeaderBytes header holds "PKVD", a version, the key length, the
/// value length, a write sequence number and a checksum (XXH3-64 chained over those fields, the
/// key and the value), then the key (at most kMaxKeyBytes); the value follows. The file is
/// kFileHeaderBytes + num_slots * slot_bytes long (so at most 4096 bytes over the budget),
/// allocated at construction (posix_fallocate; a sparse file where that is unsupported).
/// Nothing is fsync'ed: entries outlive the process, not a power loss (a torn slot then fails
/// its checksum and is free at the next open).
///
/// Index: key -> slot in memory; an LRU list over the held slots; a free-slot stack. put() of a
/// new key takes a free slot, else evicts the least recently used entry (its key is reported by
/// take_evicted()). I/O: one pwrite (header + value from one buffer) per put, one pread per get;
/// lengths and offsets are multiples of 4096, so direct_io needs no bounce copies.
///
/// Persistence: the file outlives the tier (the destructor closes it, never unlinks it). A new
/// DiskTier on a file whose header matches its slot_bytes and num_slots rebuilds the index by
/// reading every slot (bounded by the file size): a slot whose header and checksum are valid is
/// an entry, LRU order = write order; any other slot is free. A file with another layout (a
/// different max_value_bytes or budget) or no valid header is reinitialised: truncated, all
/// slots free. So a later process on the same machine reuses an earlier one's entries. The file
/// is held under an exclusive flock(2) while the tier lives: a second DiskTier on the same file,
/// in this process or another, throws instead of silently overwriting the first one's slots.
///
/// Faults: a read that fails or a slot whose magic, key, length or checksum does not match is
/// dropped (counted in failures; get() returns empty), never returned. A write failing with
/// ENOSPC (a full disk, possible where the file could not be preallocated) makes the tier stop
/// accepting: that and every later put() returns kFull. Any other write error returns kFailed.
/// Either way the slot is freed and the key's old entry, if any, is gone.
///
/// Internally synchronized by one mutex; file I/O runs under it, so calls are serialized (at
/// most one I/O in flight; contains() waits for a running put() or get()).
///
/// Worked example: budget = 3 slots. put a, b, c; get(a) (a becomes most recent); put d evicts
/// b (the least recently used); take_evicted() == {"b"}, then {} on the next call.
class DiskTier final : public KVTier {
 public:
  static constexpr int64_t kFileHeaderBytes = 4096;            ///< header at offset 0, slots follow
  static constexpr int64_t kSlotHeaderBytes = 256;             ///< slot header; the value follows
  static constexpr int64_t kMaxKeyBytes = 224;                 ///< longest key a slot header holds
  static constexpr int64_t kMaxValueBytes = int64_t{1} << 30;  ///< bound of max_value_bytes
  static constexpr int64_t kAlignment = 4096;  ///< I/O alignment: slot size, offsets, lengths

  /// Bytes of one slot for values of at most `max_value_bytes`:
  /// round_up(kSlotHeaderBytes + max_value_bytes, kAlignment); e.g. 1000 -> 4096, 3841 -> 8192.
  [[nodiscard]] static int64_t slot_bytes_for(int64_t max_value_bytes);

  /// Opens (or creates) config.path and rebuilds the index from it (see the class comment).
  /// Errors: throws pagedkv::Error naming the value if the path is empty, max_value_bytes is
  /// outside [1, kMaxValueBytes], budget_bytes < slot_bytes (naming both); naming the path and
  /// the OS error if the file cannot be opened (a missing directory; O_DIRECT refused by the
  /// filesystem: EINVAL), is locked by another DiskTier, or cannot be allocated (ENOSPC: naming
  /// the size in bytes) or read.
  explicit DiskTier(DiskTierConfig config);
  /// Closes the file (it stays on disk with its entries, by design).
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  /// "disk".
  [[nodiscard]] std::string_view name() const override { return "disk"; }
  /// TierMedium::kDisk.
  [[nodiscard]] TierMedium medium() const override { return TierMedium::kDisk; }

  /// Writes `value` to the key's slot (a free one, or the LRU entry's, evicting it). Returns
  /// kTooLarge if value.size() > max_value_bytes (an existing entry stays), kFull once a write
  /// hit ENOSPC, kFailed on another write error (see the class comment).
  /// Errors: throws pagedkv::Error if key or value is empty or key.size() > kMaxKeyBytes.
  PutOutcome put(std::string_view key, std::span<const std::byte> value) override;

  /// Reads and verifies the key's slot; empty on a miss, a read error or a mismatch (the entry
  /// is dropped then). A hit becomes most recently used.
  /// Errors: throws pagedkv::Error if key is empty or key.size() > kMaxKeyBytes.
  [[nodiscard]] std::optional<std::vector<std::byte>> get(std::string_view key) override;

  /// Index lookups only (no I/O, LRU order unchanged). Shapes: out [keys.size()].
  /// Errors: throws pagedkv::Error if a key is empty or longer than kMaxKeyBytes.
  [[nodiscard]] std::vector<bool> contains(std::span<const std::string> keys) override;

  /// Keys evicted by LRU since the last call, oldest first.
  [[nodiscard]] std::vector<std::string> take_evicted() override;

  /// Counters; budget_bytes = num_slots * slot_bytes, used_bytes = the held values' bytes.
  [[nodiscard]] TierStats stats() const override;

  /// Bytes of one slot (slot_bytes_for(max_value_bytes)).
  [[nodiscard]] int64_t slot_bytes() const { return slot_bytes_; }
  /// Slots in the file: budget_bytes / slot_bytes.
  [[nodiscard]] int64_t num_slots() const { return num_slots_; }
  /// Entries found in the file at construction (0 after a reinitialisation).
  [[nodiscard]] int64_t recovered_entries() const { return recovered_; }
  /// False once a write hit ENOSPC: every later put() returns kFull.
  [[nodiscard]] bool accepting() const;

 private:
  friend struct test_hooks::DiskTierFaults;
  struct Slot {
    std::string key;  // empty = free
    int64_t value_bytes = 0;
    uint64_t sequence = 0;  // write order, restored from the slot header
    int64_t prev = -1;      // LRU links over held slots, -1 = none
    int64_t next = -1;
  };
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void open_file();
  [[nodiscard]] bool header_matches();
  void reinitialise();
  void rebuild_index();
  [[nodiscard]] bool load_slot(int64_t slot);  // reads a slot into slots_[slot] if valid
  [[nodiscard]] int64_t take_slot();           // a free slot, else the LRU one (evicting it)
  void remove_entry(int64_t slot);             // out of the index and the LRU list
  void drop(int64_t slot);                     // remove_entry, then onto the free stack
  void link_mru(int64_t slot);
  void unlink(int64_t slot);
  [[nodiscard]] int write_slot(int64_t slot, std::string_view key,
                               std::span<const std::byte> value);  // 0 or an errno
  [[nodiscard]] bool read_slot(int64_t slot, int64_t length);      // into buf_
  [[nodiscard]] int64_t slot_offset(int64_t slot) const;

  DiskTierConfig config_;
  int64_t slot_bytes_ = 0;
  int64_t num_slots_ = 0;
  int64_t recovered_ = 0;
  int fd_ = -1;
  std::unique_ptr<std::byte, FreeDeleter> buf_;  // [slot_bytes], kAlignment-aligned I/O buffer
  mutable std::mutex mu_;                        // guards everything below and buf_
  std::vector<Slot> slots_;                      // [num_slots]
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> index_;  // key -> slot
  std::vector<int64_t> free_;  // free slots, the next one taken at the back
  int64_t lru_head_ = -1;      // least recently used held slot
  int64_t lru_tail_ = -1;      // most recently used
  uint64_t next_sequence_ = 1;
  bool accepting_ = true;
  std::vector<std::string> evicted_;
  TierStats stats_;
  int fail_next_write_ = 0;  // test hooks: an errno the next pwrite / pread fails with
  int fail_next_read_ = 0;
};

}  // namespace pagedkv

#include "pagedkv/tiers/disk_tier.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/check.hpp"

namespace pagedkv {
namespace {

// File header: "PKVF", u32 version, u64 slot_bytes, u64 num_slots, u64 XXH3-64 of bytes [0, 24).
// Slot header: "PKVD", u16 version, u16 key length, u64 value length, u64 sequence, u64 checksum
// (XXH3-64 chained over bytes [0, 24), the key and the value), the key at kKeyOffset.
constexpr char kFileMagic[4] = {'P', 'K', 'V', 'F'};
constexpr char kSlotMagic[4] = {'P', 'K', 'V', 'D'};
constexpr uint32_t kFileVersion = 1;
constexpr uint16_t kSlotVersion = 1;
constexpr size_t kKeyOffset = 32;
static_assert(kKeyOffset + DiskTier::kMaxKeyBytes <= DiskTier::kSlotHeaderBytes);

void store(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

uint64_t load(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

int64_t round_up(int64_t n) {
  return (n + DiskTier::kAlignment - 1) / DiskTier::kAlignment * DiskTier::kAlignment;
}

// Bytes read or written for a value: its slot header and the value, in whole 4096-byte pages.
int64_t io_bytes(int64_t value_bytes) { return round_up(DiskTier::kSlotHeaderBytes + value_bytes); }

struct SlotHeader {
  int64_t key_bytes = 0;
  int64_t value_bytes = 0;
  uint64_t sequence = 0;
  uint64_t checksum = 0;
};

uint64_t slot_checksum(const std::byte* slot, int64_t key_bytes, int64_t value_bytes) {
  const uint64_t fields = XXH3_64bits(slot, 24);
  const uint64_t key = XXH3_64bits_withSeed(slot + kKeyOffset, key_bytes, fields);
  return XXH3_64bits_withSeed(slot + DiskTier::kSlotHeaderBytes, value_bytes, key);
}

// The header of a slot buffer, if its magic, version and lengths are plausible.
std::optional<SlotHeader> parse_slot(const std::byte* slot, int64_t max_value_bytes) {
  if (std::memcmp(slot, kSlotMagic, 4) != 0 || load(slot + 4, 2) != kSlotVersion) return {};
  SlotHeader h{static_cast<int64_t>(load(slot + 6, 2)), static_cast<int64_t>(load(slot + 8, 8)),
               load(slot + 16, 8), load(slot + 24, 8)};
  if (h.key_bytes < 1 || h.key_bytes > DiskTier::kMaxKeyBytes) return {};
  if (h.value_bytes < 1 || h.value_bytes > max_value_bytes) return {};
  return h;
}

void check_key(std::string_view key, const char* op) {
  PAGEDKV_CHECK(!key.empty(), "DiskTier::{}: the key is empty", op);
  PAGEDKV_CHECK(std::cmp_less_equal(key.size(), DiskTier::kMaxKeyBytes),
                "DiskTier::{}: key '{}...' is {} bytes, the limit is {}", op, key.substr(0, 32),
                key.size(), DiskTier::kMaxKeyBytes);
}

// pread/pwrite of exactly `length` bytes, resuming after short transfers: 0 or an errno
// (EIO for an unexpected end of file or a zero-byte write).
template <typename Io, typename Ptr>
int transfer(Io io, int fd, Ptr buf, int64_t length, int64_t offset) {
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = io(fd, buf + done, static_cast<size_t>(length - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += n;
  }
  return 0;
}

}  // namespace

void DiskTier::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

int64_t DiskTier::slot_bytes_for(int64_t max_value_bytes) {
  PAGEDKV_CHECK(max_value_bytes >= 1 && max_value_bytes <= kMaxValueBytes,
                "DiskTier: max_value_bytes must be in [1, {}], got {}", kMaxValueBytes,
                max_value_bytes);
  return round_up(kSlotHeaderBytes + max_value_bytes);
}

DiskTier::DiskTier(DiskTierConfig config) : config_(std::move(config)) {
  PAGEDKV_CHECK(!config_.path.empty(), "DiskTier: the path is empty");
  slot_bytes_ = slot_bytes_for(config_.max_value_bytes);
  PAGEDKV_CHECK(config_.budget_bytes <= (int64_t{1} << 60),
                "DiskTier: budget_bytes {} exceeds 2^60", config_.budget_bytes);
  num_slots_ = config_.budget_bytes / slot_bytes_;
  PAGEDKV_CHECK(num_slots_ >= 1,
                "DiskTier: budget_bytes {} is below one slot of {} bytes (max_value_bytes {} "
                "plus a {}-byte header, rounded up to {})",
                config_.budget_bytes, slot_bytes_, config_.max_value_bytes, kSlotHeaderBytes,
                kAlignment);
  void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(slot_bytes_));
  if (p == nullptr) throw std::bad_alloc();
  buf_.reset(static_cast<std::byte*>(p));
  stats_.budget_bytes = num_slots_ * slot_bytes_;
  try {
    open_file();
    const bool reuse = header_matches();
    if (!reuse) reinitialise();
    slots_.resize(num_slots_);
    if (reuse) rebuild_index();
    for (int64_t s = num_slots_ - 1; s >= 0; --s) {
      if (slots_[s].key.empty()) free_.push_back(s);
    }
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    throw;
  }
}

DiskTier::~DiskTier() { ::close(fd_); }

void DiskTier::open_file() {
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (config_.direct_io ? O_DIRECT : 0);
  fd_ = ::open(config_.path.c_str(), flags, 0644);
  if (fd_ < 0) {
    const int e = errno;
    detail::fail("DiskTier: cannot open '{}'{}: {} (errno {})", config_.path,
                 config_.direct_io ? " with O_DIRECT" : "", std::strerror(e), e);
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    detail::fail("DiskTier: '{}' is in use by another DiskTier (flock: {})", config_.path,
                 std::strerror(e));
  }
}

int64_t DiskTier::slot_offset(int64_t slot) const { return kFileHeaderBytes + slot * slot_bytes_; }

bool DiskTier::header_matches() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || st.st_size < slot_offset(num_slots_)) return false;
  std::byte* b = buf_.get();
  if (transfer(::pread, fd_, b, kFileHeaderBytes, 0) != 0) return false;
  return std::memcmp(b, kFileMagic, 4) == 0 && load(b + 4, 4) == kFileVersion &&
         std::cmp_equal(load(b + 8, 8), slot_bytes_) &&
         std::cmp_equal(load(b + 16, 8), num_slots_) && load(b + 24, 8) == XXH3_64bits(b, 24);
}

void DiskTier::reinitialise() {
  const int64_t size = slot_offset(num_slots_);
  if (::ftruncate(fd_, 0) != 0) {
    detail::fail("DiskTier: cannot truncate '{}': {}", config_.path, std::strerror(errno));
  }
  const int r = ::posix_fallocate(fd_, 0, size);
  if (r == ENOSPC) {
    (void)!::ftruncate(fd_, 0);  // give back what was allocated before the device filled
    detail::fail("DiskTier: cannot allocate {} bytes for '{}': no space left on device (ENOSPC)",
                 size, config_.path);
  }
  // Where the filesystem cannot preallocate (EOPNOTSUPP; EINVAL under O_DIRECT) the file is
  // sparse, and a later write may meet a full disk: put() answers kFull then.
  if (r != 0 && ::ftruncate(fd_, size) != 0) {
    detail::fail("DiskTier: cannot size '{}' to {} bytes: {}", config_.path, size,
                 std::strerror(errno));
  }
  std::byte* b = buf_.get();
  std::memset(b, 0, kFileHeaderBytes);
  std::memcpy(b, kFileMagic, 4);
  store(b + 4, kFileVersion, 4);
  store(b + 8, static_cast<uint64_t>(slot_bytes_), 8);
  store(b + 16, static_cast<uint64_t>(num_slots_), 8);
  store(b + 24, XXH3_64bits(b, 24), 8);
  if (const int e =
          transfer(::pwrite, fd_, static_cast<const std::byte*>(b), kFileHeaderBytes, 0)) {
    detail::fail("DiskTier: cannot write the header of '{}': {}", config_.path, std::strerror(e));
  }
}

bool DiskTier::load_slot(int64_t slot) {
  if (!read_slot(slot, kAlignment)) return false;
  const std::byte* b = buf_.get();
  const std::optional<SlotHeader> h = parse_slot(b, config_.max_value_bytes);
  if (!h) return false;
  const int64_t length = io_bytes(h->value_bytes);
  if (length > kAlignment && !read_slot(slot, length)) return false;
  if (slot_checksum(b, h->key_bytes, h->value_bytes) != h->checksum) return false;
  Slot& s = slots_[slot];
  s.key.assign(reinterpret_cast<const char*>(b + kKeyOffset), h->key_bytes);
  s.value_bytes = h->value_bytes;
  s.sequence = h->sequence;
  return true;
}

void DiskTier::rebuild_index() {
  std::vector<int64_t> held;
  for (int64_t s = 0; s < num_slots_; ++s) {
    if (load_slot(s)) held.push_back(s);
  }
  std::sort(held.begin(), held.end(),
            [&](int64_t a, int64_t b) { return slots_[a].sequence < slots_[b].sequence; });
  for (const int64_t s : held) {
    const auto [it, inserted] = index_.try_emplace(slots_[s].key, s);
    if (!inserted) {  // a key left in two slots (a failed read freed the first): keep the newer
      const int64_t older = it->second;
      unlink(older);
      stats_.used_bytes -= slots_[older].value_bytes;
      slots_[older] = Slot{};
      it->second = s;
    }
    link_mru(s);
    stats_.used_bytes += slots_[s].value_bytes;
    next_sequence_ = std::max(next_sequence_, slots_[s].sequence + 1);
  }
  recovered_ = static_cast<int64_t>(index_.size());
}

void DiskTier::link_mru(int64_t slot) {
  Slot& s = slots_[slot];
  s.prev = lru_tail_;
  s.next = -1;
  if (lru_tail_ >= 0) {
    slots_[lru_tail_].next = slot;
  } else {
    lru_head_ = slot;
  }
  lru_tail_ = slot;
}

void DiskTier::unlink(int64_t slot) {
  Slot& s = slots_[slot];
  if (s.prev >= 0) {
    slots_[s.prev].next = s.next;
  } else {
    lru_head_ = s.next;
  }
  if (s.next >= 0) {
    slots_[s.next].prev = s.prev;
  } else {
    lru_tail_ = s.prev;
  }
  s.prev = s.next = -1;
}

void DiskTier::remove_entry(int64_t slot) {
  Slot& s = slots_[slot];
  unlink(slot);
  index_.erase(s.key);
  stats_.used_bytes -= s.value_bytes;
  s = Slot{};
}

void DiskTier::drop(int64_t slot) {
  remove_entry(slot);
  free_.push_back(slot);
}

int64_t DiskTier::take_slot() {
  if (!free_.empty()) {
    const int64_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  const int64_t slot = lru_head_;  // every slot is held: num_slots >= 1, so there is one
  evicted_.push_back(slots_[slot].key);
  ++stats_.evictions;
  remove_entry(slot);
  return slot;
}

bool DiskTier::read_slot(int64_t slot, int64_t length) {
  if (fail_next_read_ != 0) {
    fail_next_read_ = 0;
    return false;
  }
  return transfer(::pread, fd_, buf_.get(), length, slot_offset(slot)) == 0;
}

int DiskTier::write_slot(int64_t slot, std::string_view key, std::span<const std::byte> value) {
  const auto value_bytes = static_cast<int64_t>(value.size());
  const int64_t length = io_bytes(value_bytes);
  std::byte* b = buf_.get();
  std::memset(b, 0, kSlotHeaderBytes);
  std::memcpy(b, kSlotMagic, 4);
  store(b + 4, kSlotVersion, 2);
  store(b + 6, key.size(), 2);
  store(b + 8, static_cast<uint64_t>(value_bytes), 8);
  store(b + 16, next_sequence_, 8);
  std::memcpy(b + kKeyOffset, key.data(), key.size());
  std::memcpy(b + kSlotHeaderBytes, value.data(), value.size());
  std::memset(b + kSlotHeaderBytes + value_bytes, 0, length - kSlotHeaderBytes - value_bytes);
  store(b + 24, slot_checksum(b, static_cast<int64_t>(key.size()), value_bytes), 8);
  if (const int e = std::exchange(fail_next_write_, 0)) return e;
  return transfer(::pwrite, fd_, static_cast<const std::byte*>(b), length, slot_offset(slot));
}

PutOutcome DiskTier::put(std::string_view key, std::span<const std::byte> value) {
  check_key(key, "put");
  PAGEDKV_CHECK(!value.empty(), "DiskTier::put: the value of key '{}' is empty", key);
  const std::lock_guard lock(mu_);
  if (std::cmp_greater(value.size(), config_.max_value_bytes)) {
    ++stats_.rejected;
    return PutOutcome::kTooLarge;
  }
  if (!accepting_) {
    ++stats_.rejected;
    return PutOutcome::kFull;
  }
  // The key's own slot is rewritten in place; its entry leaves the index before the write, so
  // a failed write cannot leave the index pointing at half-written bytes.
  const auto it = index_.find(key);
  int64_t slot = -1;
  if (it != index_.end()) {
    slot = it->second;
    remove_entry(slot);
  } else {
    slot = take_slot();
  }
  if (const int e = write_slot(slot, key, value)) {
    free_.push_back(slot);
    if (e == ENOSPC || e == EDQUOT) {
      accepting_ = false;
      ++stats_.rejected;
      return PutOutcome::kFull;
    }
    ++stats_.failures;
    return PutOutcome::kFailed;
  }
  Slot& s = slots_[slot];
  s.key.assign(key);
  s.value_bytes = static_cast<int64_t>(value.size());
  s.sequence = next_sequence_++;
  index_.emplace(s.key, slot);
  link_mru(slot);
  ++stats_.puts;
  stats_.bytes_written += s.value_bytes;
  stats_.used_bytes += s.value_bytes;
  return PutOutcome::kStored;
}

std::optional<std::vector<std::byte>> DiskTier::get(std::string_view key) {
  check_key(key, "get");
  const std::lock_guard lock(mu_);
  ++stats_.gets;
  const auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  const int64_t slot = it->second;
  const int64_t value_bytes = slots_[slot].value_bytes;
  const std::byte* b = buf_.get();
  std::optional<SlotHeader> h;
  const bool ok =
      read_slot(slot, io_bytes(value_bytes)) && (h = parse_slot(b, config_.max_value_bytes)) &&
      std::cmp_equal(h->key_bytes, key.size()) &&
      std::memcmp(b + kKeyOffset, key.data(), key.size()) == 0 && h->value_bytes == value_bytes &&
      slot_checksum(b, h->key_bytes, value_bytes) == h->checksum;
  if (!ok) {  // a read error, or bytes that are not what put() wrote: a miss, never wrong bytes
    ++stats_.failures;
    drop(slot);
    return std::nullopt;
  }
  ++stats_.hits;
  stats_.bytes_read += value_bytes;
  unlink(slot);
  link_mru(slot);
  return std::vector<std::byte>(b + kSlotHeaderBytes, b + kSlotHeaderBytes + value_bytes);
}

std::vector<bool> DiskTier::contains(std::span<const std::string> keys) {
  for (const std::string& key : keys) check_key(key, "contains");
  const std::lock_guard lock(mu_);
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = index_.find(keys[i]) != index_.end();
  return out;
}

std::vector<std::string> DiskTier::take_evicted() {
  const std::lock_guard lock(mu_);
  return std::exchange(evicted_, {});
}

TierStats DiskTier::stats() const {
  const std::lock_guard lock(mu_);
  TierStats s = stats_;
  s.entries = static_cast<int64_t>(index_.size());
  return s;
}

bool DiskTier::accepting() const {
  const std::lock_guard lock(mu_);
  return accepting_;
}

}  // namespace pagedkv

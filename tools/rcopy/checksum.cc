#include "tools/rcopy/checksum.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <vector>

#include "base/crc32c.h"
#include "fmt/format.h"

namespace canopy::rcopy {

struct Digest::Xxh3State {
  XXH3_state_t* state = nullptr;
  Xxh3State() : state(XXH3_createState()) {}
  ~Xxh3State() { XXH3_freeState(state); }
};

Digest::Digest(ChecksumAlgorithm algorithm) : algorithm_(algorithm) {
  if (algorithm_ == ChecksumAlgorithm::kXxh3) {
    xxh3_ = std::make_unique<Xxh3State>();
    XXH3_64bits_reset(xxh3_->state);
  }
}

Digest::~Digest() = default;

void Digest::Update(const void* data, size_t n) {
  switch (algorithm_) {
    case ChecksumAlgorithm::kNone: break;
    case ChecksumAlgorithm::kXxh3: XXH3_64bits_update(xxh3_->state, data, n); break;
    case ChecksumAlgorithm::kCrc32c: crc_ = crc32c::Extend(crc_, data, n); break;
  }
}

uint64_t Digest::Value() const {
  switch (algorithm_) {
    case ChecksumAlgorithm::kNone: return 0;
    case ChecksumAlgorithm::kXxh3: return XXH3_64bits_digest(xxh3_->state);
    case ChecksumAlgorithm::kCrc32c: return crc_;
  }
  return 0;
}

uint64_t DigestOf(ChecksumAlgorithm algorithm, std::string_view bytes) {
  Digest digest(algorithm);
  digest.Update(bytes);
  return digest.Value();
}

Result<uint64_t> DigestFileRange(int fd, uint64_t offset, uint64_t length, ChecksumAlgorithm algorithm,
                                 const std::atomic<bool>* cancel) {
  Digest digest(algorithm);
  if (algorithm == ChecksumAlgorithm::kNone) return uint64_t{0};
  CANOPY_RETURN_IF_ERROR(UpdateDigestFromFile(digest, fd, offset, length, cancel));
  return digest.Value();
}

Status UpdateDigestFromFile(Digest& digest, int fd, uint64_t offset, uint64_t length,
                            const std::atomic<bool>* cancel) {
  constexpr size_t kPiece = 1u << 20;
  std::vector<char> buffer(std::min<uint64_t>(kPiece, std::max<uint64_t>(length, 1)));
  while (length > 0) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("checksum cancelled");
    }
    size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), length));
    ssize_t got = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read for checksum at offset " + std::to_string(offset));
    }
    if (got == 0) {
      return Status::Corruption("file ended at offset " + std::to_string(offset) + " while checksumming " +
                                std::to_string(length) + " more bytes");
    }
    digest.Update(buffer.data(), static_cast<size_t>(got));
    offset += static_cast<uint64_t>(got);
    length -= static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

std::string DigestHex(uint64_t digest) { return fmt::format("{:016x}", digest); }

}  // namespace canopy::rcopy

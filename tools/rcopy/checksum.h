// Streaming digests for rcopy --verify: XXH3-64 (xxhash) or CRC32C.
//
// A Digest is fed the bytes of one byte range in order and yields a 64-bit
// value (CRC32C zero-extended). Both ends compute it independently: the client
// over its source file, the server over what landed in its temporary file.
//
// Thread safety: a Digest is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/result.h"
#include "tools/rcopy/protocol.h"

namespace canopy::rcopy {

class Digest {
 public:
  // kNone yields 0 for any input.
  explicit Digest(ChecksumAlgorithm algorithm);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void Update(const void* data, size_t n);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // The digest of everything fed so far (may be called more than once).
  uint64_t Value() const;
  ChecksumAlgorithm algorithm() const { return algorithm_; }

 private:
  struct Xxh3State;
  ChecksumAlgorithm algorithm_;
  std::unique_ptr<Xxh3State> xxh3_;
  uint32_t crc_ = 0;
};

// One-shot digest of bytes.
uint64_t DigestOf(ChecksumAlgorithm algorithm, std::string_view bytes);

// Digest of [offset, offset + length) of an open file, read with pread in
// 1 MiB pieces. Corruption if the file is shorter; IOError etc. from the read;
// Aborted as soon as *cancel becomes true (when cancel is not null).
Result<uint64_t> DigestFileRange(int fd, uint64_t offset, uint64_t length, ChecksumAlgorithm algorithm,
                                 const std::atomic<bool>* cancel = nullptr);

// The same, feeding the bytes into `digest` (which may already hold the bytes
// before offset: the digest of a whole file can be built range by range, in
// order). On error `digest` holds an unspecified prefix.
Status UpdateDigestFromFile(Digest& digest, int fd, uint64_t offset, uint64_t length,
                            const std::atomic<bool>* cancel = nullptr);

// 16 lowercase hex digits.
std::string DigestHex(uint64_t digest);

}  // namespace canopy::rcopy

// ByteRing: a fixed-capacity FIFO of bytes addressed by absolute stream
// offsets, used for the DPDK backend's send and receive buffers.
// Bytes [begin(), end()) are held; Append adds at end(), Consume drops from
// begin(). Thread safety: none; the owning ConnState's mutex guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace canopy::transport::dpdk {

class ByteRing {
 public:
  explicit ByteRing(size_t capacity) : buf_(capacity) {}

  size_t capacity() const { return buf_.size(); }
  size_t size() const { return static_cast<size_t>(end_ - begin_); }
  size_t space() const { return capacity() - size(); }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }

  // Appends min(n, space()) bytes; returns how many.
  size_t Append(const char* src, size_t n) {
    n = std::min(n, space());
    size_t done = 0;
    while (done < n) {
      size_t pos = static_cast<size_t>((end_ + done) % capacity());
      size_t chunk = std::min(n - done, capacity() - pos);
      std::memcpy(buf_.data() + pos, src + done, chunk);
      done += chunk;
    }
    end_ += n;
    return n;
  }

  // Calls fill(dst, len, src_offset) for pieces covering the next n bytes
  // (REQUIRES: n <= space()), then appends them.
  template <typename Fill>
  void AppendWith(size_t n, Fill fill) {
    size_t done = 0;
    while (done < n) {
      size_t pos = static_cast<size_t>((end_ + done) % capacity());
      size_t chunk = std::min(n - done, capacity() - pos);
      fill(buf_.data() + pos, chunk, done);
      done += chunk;
    }
    end_ += n;
  }

  // Copies n bytes starting at absolute offset `from` (REQUIRES: inside
  // [begin(), end())) to dst, without consuming them.
  void CopyOut(uint64_t from, size_t n, char* dst) const {
    size_t done = 0;
    while (done < n) {
      size_t pos = static_cast<size_t>((from + done) % capacity());
      size_t chunk = std::min(n - done, capacity() - pos);
      std::memcpy(dst + done, buf_.data() + pos, chunk);
      done += chunk;
    }
  }

  // Drops bytes up to absolute offset `upto` (clamped to end()).
  void ConsumeTo(uint64_t upto) { begin_ = std::max(begin_, std::min(upto, end_)); }

  // Copies out and consumes min(n, size()) bytes; returns how many.
  size_t Read(char* dst, size_t n) {
    n = std::min(n, size());
    CopyOut(begin_, n, dst);
    begin_ += n;
    return n;
  }

 private:
  std::vector<char> buf_;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
};

}  // namespace canopy::transport::dpdk

// The rcopy client: sends one local file to an rcopy server over any
// transport (tcp://, dpdk://, rdma://).
//
// With N streams the file is split into N byte ranges (SplitRange) sent
// concurrently over N connections; data moves with SendWithBulk straight from
// the file (sendfile on TCP). With verify, each side computes a digest of each
// range (the client from its file, the server from what it wrote) and both
// compare them; a mismatch fails the copy and the server publishes nothing.
//
// Resume (options.resume): before sending, the client asks the server (QUERY,
// protocol.h) what it holds for the destination: the partial file an
// interrupted copy left (".<name>.rcopy-partial", see server.h: a copy cut
// off by a disconnect, a silent client or a stopping server keeps the
// contiguous prefix that arrived there unless keep_partial is false), else
// the existing destination file itself, with its size and the checksum
// (options.checksum: XXH3-64 or CRC32C) of all of it.
//  - Nothing there (or an empty file): the whole file is sent
//    (ResumeOutcome::kNothing).
//  - Longer than the source: the whole file is sent again from offset 0
//    (kLonger).
//  - Not longer: the client checksums the same prefix of its source. Equal:
//    only the remaining bytes are sent, the server starting its temporary
//    file from the partial file (taken over) or from a copy of the target's
//    prefix (kResumed; CopyReport::resumed_from == bytes_skipped == that
//    size). A target already equal to the source is left as it is and
//    nothing is sent (kComplete). Different: the whole file is sent again
//    from offset 0 (kPrefixMismatch, "prefix mismatch").
// The final file is still published atomically (temporary file + rename),
// and with verify the server checksums the whole resumed file before
// publishing and both sides compare it with the client's checksum of the
// whole source (besides the per-range checksums of what was sent). Should the
// base change between the QUERY and the OPEN, the copy fails with Conflict.
//
// Rate (options.rate_bits_per_second): a token bucket shared by the streams
// of a copy paces DATA messages to that many bits per second in total (not
// per stream); messages are then at most ~20 ms of data (>= kMinChunkBytes),
// and the bucket starts empty, holding at most 20 ms of credit.
//
// The copy succeeds only when the server reports the file published under its
// final name. Any failure (refused name, disk full, connection lost, checksum
// mismatch) is returned in CopyReport::status with the reason, preferring the
// server's own explanation over the transport error it caused.
//
// Thread safety: CopyFile may run concurrently with itself; the progress
// callback is called from an internal thread, never concurrently with itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/rcopy/protocol.h"
#include "transport/transport.h"

namespace canopy::rcopy {

struct ClientOptions {
  std::string source;        // local regular file
  std::string scheme = "tcp";
  std::string host;          // IPv6 literals without brackets
  uint16_t port = kDefaultPort;
  std::string destination;   // path relative to the server's root
  uint64_t chunk_bytes = 4u << 20;  // bulk bytes per DATA message
  uint16_t streams = 1;             // 1..kMaxStreams
  bool verify = false;
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kXxh3;  // used when verify
  bool sink = false;                // ask the server to discard the data
  bool resume = false;              // see above; not with sink
  bool keep_partial = true;         // ask the server to keep an interrupted copy's prefix
  uint64_t rate_bits_per_second = 0;  // 0: unlimited
  transport::TransportOptions transport;
  // Shared secret of the server (tools/rcopy/auth.h); empty: do not
  // authenticate (the server must then be open).
  std::string secret;
  // Called about every 200 ms while the copy runs, and once at the end, with
  // the bytes the server has (skipped + sent) and the file size.
  std::function<void(uint64_t bytes_done, uint64_t total_bytes)> progress;
};

enum class ResumeOutcome {
  kNotRequested,   // "not requested"
  kNothing,        // "nothing to resume": no partial file and no target (or empty)
  kResumed,        // "resumed": only the bytes after resumed_from were sent
  kComplete,       // "already complete": the target equals the source, nothing sent
  kPrefixMismatch, // "prefix mismatch": whole file sent again from offset 0
  kLonger,         // "longer than source": whole file sent again from offset 0
};
const char* ResumeOutcomeName(ResumeOutcome outcome);

struct CopyReport {
  Status status;            // OK when the file is published (or sunk)
  std::string server_uri;   // scheme://host:port
  std::string destination;
  uint64_t file_bytes = 0;  // size of the source file
  uint64_t bytes_sent = 0;  // bulk bytes handed to the transport
  // Resume: what the server held, what was made of it.
  ResumeOutcome resume = ResumeOutcome::kNotRequested;
  ResumeBase resume_base = ResumeBase::kNone;  // where the existing bytes were
  uint64_t existing_bytes = 0;  // size of the partial file / target found
  uint64_t resumed_from = 0;    // first byte sent (0 unless kResumed/kComplete)
  uint64_t bytes_skipped = 0;   // bytes not sent because the server had them (== resumed_from)
  uint64_t rate_bits_per_second = 0;  // the limit asked for, 0 = none
  double seconds = 0;       // first connect to last RESULT
  uint16_t streams = 1;
  uint64_t chunk_bytes = 0;  // bytes per DATA message actually used (see Rate)
  bool sink = false;
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;  // kNone unless verified
  std::vector<uint64_t> digests;  // per stream, when verified and ok
  // Whole-file digest both sides agreed on (verified resumes), else 0.
  uint64_t file_digest = 0;

  // Over the bytes sent (a resumed copy counts only what it sent).
  // Decimal: 1 Gbit = 1e9 bits. 0 when seconds is 0.
  double gbit_per_second() const;
};

CopyReport CopyFile(const ClientOptions& options);

// The bytes per DATA message CopyFile uses: options.chunk_bytes, or less
// under a rate limit (see Rate above).
uint64_t EffectiveChunkBytes(const ClientOptions& options);

// "tcp://host:port", brackets around IPv6 literals.
std::string MakeUri(const std::string& scheme, const std::string& host, uint16_t port);

}  // namespace canopy::rcopy

// The rcopy client: sends one local file to an rcopy server over any
// transport (tcp://, dpdk://, rdma://).
//
// With N streams the file is split into N byte ranges (SplitRange) sent
// concurrently over N connections; data moves with SendWithBulk straight from
// the file (sendfile on TCP). With verify, each side computes a digest of each
// range (the client from its file, the server from what it wrote) and both
// compare them; a mismatch fails the copy and the server publishes nothing.
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
  transport::TransportOptions transport;
  // Called about every 200 ms while the copy runs, and once at the end.
  std::function<void(uint64_t bytes_sent, uint64_t total_bytes)> progress;
};

struct CopyReport {
  Status status;            // OK when the file is published (or sunk)
  std::string server_uri;   // scheme://host:port
  std::string destination;
  uint64_t file_bytes = 0;  // size of the source file
  uint64_t bytes_sent = 0;  // bulk bytes handed to the transport
  double seconds = 0;       // first connect to last RESULT
  uint16_t streams = 1;
  uint64_t chunk_bytes = 0;
  bool sink = false;
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;  // kNone unless verified
  std::vector<uint64_t> digests;  // per stream, when verified and ok

  // Decimal: 1 Gbit = 1e9 bits. 0 when seconds is 0.
  double gbit_per_second() const;
};

CopyReport CopyFile(const ClientOptions& options);

// "tcp://host:port", brackets around IPv6 literals.
std::string MakeUri(const std::string& scheme, const std::string& host, uint16_t port);

}  // namespace canopy::rcopy

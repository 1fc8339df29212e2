// The rcopy server: receives files over any transport and publishes them
// under its root directory.
//
// Guarantees:
//  - Nothing is written outside the root: names are checked with
//    SplitSafeRelativePath and opened with OpenParentBeneath (safe_path.h).
//  - No partial file ever appears under a final name: data goes into a
//    temporary file ".<name>.rcopy-<transfer id>.tmp" in the destination
//    directory, which is fsynced once, then renamed over the final name (and
//    the directory fsynced) after every stream has committed (and, with
//    --verify, every range checksum matched).
//  - What a failed transfer leaves: when it was interrupted (the client
//    disconnected or went silent for idle_timeout, or the server was
//    stopped) and the client set kOpenFlagKeepPartial (rcopy does unless
//    --no-partial), the temporary file is cut to the contiguous prefix that
//    arrived (with N streams: stream 1's range, then stream 2's while the
//    previous ones are complete, ...) and renamed to ".<name>.rcopy-partial"
//    (PartialFileName) once the last stream left, replacing an older one; an
//    empty prefix is removed. Any other failure (checksum mismatch, protocol
//    violation, disk full, write error) removes the temporary file. A server
//    that dies (SIGKILL, crash) leaves its ".tmp" files behind: a live
//    transfer holds its temporary file locked (flock), and a resume QUERY
//    for the name first turns every unlocked one (an orphan) into the
//    partial file — the prefix written from the start, up to the first hole
//    — unless the partial file there is as long; other orphans of the name
//    are removed. Publishing a file removes its partial file.
//  - Resume (protocol.h): QUERY is answered from the partial file, else the
//    existing regular file under the name (never through a symlink), with
//    its size and checksum; an OPEN with a resume base takes the partial file
//    over (rename) or copies the target's prefix into a new temporary file,
//    and with verify the whole file is checksummed again before publishing.
//  - Errors (disk full, file size limit, permission denied, bad names,
//    checksum mismatch, protocol violations) go back to the client as a RESULT
//    message with the status code and reason.
//  - Each connection runs on its own thread; a connection idle for
//    idle_timeout is dropped (and its transfer fails).
//
// Thread safety: Start/Stop/local_endpoint/stats may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"
#include "transport/transport.h"

namespace canopy::rcopy {

struct ServerOptions {
  std::string root;        // directory receiving the files (must exist)
  std::string listen_uri;  // e.g. "tcp://0.0.0.0:7471" (port 0: any free port)
  transport::TransportOptions transport;
  // A connection that receives nothing for this long is dropped; also bounds
  // how long a committed stream waits for the other streams of its transfer.
  std::chrono::milliseconds idle_timeout{60000};
  // Connections beyond this are answered with a ResourceExhausted RESULT
  // ("server busy: ...") and closed; the client reports it and gives up.
  size_t max_connections = 256;
  // Shared secret (tools/rcopy/auth.h): when set, every connection must pass
  // the mutual HMAC-SHA256 handshake before anything else is read; empty: an
  // open server that answers authenticating clients with PermissionDenied.
  std::string secret;
};

struct ServerStats {
  uint64_t connections = 0;       // accepted so far
  uint64_t active_connections = 0;  // being served now (not counting refused ones)
  uint64_t peak_active_connections = 0;  // most served at once so far
  uint64_t files_published = 0;   // transfers renamed into place (or sunk)
  uint64_t transfers_failed = 0;
  uint64_t auth_failures = 0;     // connections refused by the handshake
  uint64_t bytes_received = 0;    // bulk bytes over all connections
};

class Server {
 public:
  // Opens the root, starts listening and accepting on a background thread.
  // NotFound/PermissionDenied for a bad root, the transport's error otherwise.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);

  // Stops (see Stop).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound endpoint (the real port when port 0 was asked for).
  transport::Endpoint local_endpoint() const;

  // Stops accepting, aborts open connections (their transfers fail and their
  // temporary files are removed) and waits for every connection thread.
  // Idempotent.
  void Stop();

  ServerStats stats() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::rcopy

// The transport abstraction: everything in canopy that moves bytes between
// machines goes through Transport / Listener / Connection.
//
// Backends (tcp/, dpdk/, rdma/) implement these interfaces; a URI picks one:
//   tcp://127.0.0.1:7000     kernel TCP
//   rdma://10.0.0.1:7000     librdmacm + libibverbs, RC queue pairs
//   dpdk://10.0.0.2:7000     canopy's reliable protocol over UDP/IPv4 frames on a DPDK port
// Query parameters (tcp://h:1?nodelay=0) are passed to the backend as-is.
// Backends are registered by name in a TransportRegistry; see registry.h.
//
// A Connection carries ordered, reliable, framed messages (type + payload,
// CRC32C-checked, see frame.h), and a bulk path for large buffers and files:
// SendWithBulk(type, payload, bulk) sends one message whose header announces
// bulk.size() raw bytes that follow it on the same ordered stream; the
// receiver gets the Message with bulk_bytes set and must consume exactly that
// many bytes with ReceiveBulk (one or more calls) before its next Receive.
// Backends move bulk bytes with as few copies as they can (TCP: sendfile and
// splice; RDMA: above eager_bulk the receiver RDMA-READs straight from the
// sender's registered memory or file mapping; DPDK: mbufs built
// straight from the source). Bulk bytes are not covered by the frame CRC;
// they rely on the link's own checks (TCP checksum, IB ICRC, UDP checksum);
// tools that need end-to-end integrity (rcopy --verify) add their own digest.
//
// Flow control: in-flight bytes are bounded on every backend (socket buffers,
// windows, credits). A slow receiver makes Send block; a Send that makes no
// progress for TransportOptions::io_timeout fails with Timeout.
//
// Errors (Status codes) are the same on every backend:
//   Closed        the peer shut down in an orderly way; every message it sent
//                 before that has been delivered (Receive only)
//   Unavailable   connection refused / reset / lost, peer died mid-stream
//   Timeout       deadline or io_timeout passed
//   Corruption    a frame failed its CRC, magic, version or length check;
//                 the connection is unusable afterwards
//   InvalidArgument  message larger than max_message_bytes, bad URI
//   Aborted       Close() was called (possibly from another thread)
//   NotSupported  the scheme's backend is not built in or not usable here
//
// Ownership: Transport objects are shared (shared_ptr); Listeners and
// Connections are owned by the caller (unique_ptr) and keep alive whatever
// they need of their transport, so a Transport may be released first.
//
// Thread safety: Send/SendWithBulk may be called from several threads at once
// (a connection serialises them internally, a message is never interleaved
// with another). Receive/ReceiveBulk must be called by one thread at a time.
// Close() may be called from any thread and wakes blocked calls, which then
// return Aborted. Listener::Accept is for one thread at a time; Close() from
// any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/status.h"

namespace canopy::transport {

// A parsed transport URI: scheme://host:port[?key=value&key=value].
// IPv6 literals are written in brackets (tcp://[::1]:7000) and stored without.
struct Endpoint {
  std::string scheme;
  std::string host;
  uint16_t port = 0;  // 0 when listening: the backend picks one
  std::map<std::string, std::string> params;

  // Canonical text form; ParseEndpoint(e.ToUri()) == e.
  std::string ToUri() const;
  // host:port (with brackets for IPv6), no scheme.
  std::string HostPort() const;
  bool operator==(const Endpoint&) const = default;
};

// InvalidArgument with the reason for anything that is not a well-formed URI
// (missing scheme or port, port out of range, empty host).
Result<Endpoint> ParseEndpoint(std::string_view uri);

struct TransportOptions {
  // Connect (including address/route resolution) gives up after this.
  std::chrono::milliseconds connect_timeout{5000};
  // A Send or bulk transfer that makes no progress for this long fails with
  // Timeout, and so does a backend-level liveness check (DPDK, RDMA).
  std::chrono::milliseconds io_timeout{30000};
  // Largest message payload accepted (send: InvalidArgument; receive:
  // Corruption). Bulk bytes are not limited by this.
  uint32_t max_message_bytes = 256u << 20;
  // Socket buffer size hint (TCP), or receive buffer bytes per connection.
  size_t buffer_bytes = 4u << 20;
  // Upper bound on bytes sent but not yet acknowledged by the peer
  // (DPDK window, RDMA credits x buffer size).
  size_t max_inflight_bytes = 16u << 20;
  // Backend-specific arguments: DPDK EAL arguments ("--no-huge", "-m", "512",
  // "--vdev=..."), or RDMA device selection ("device=mlx5_0"). Ignored by TCP.
  std::vector<std::string> backend_args;
};

// A received message. When bulk_bytes > 0 the caller must consume that many
// bulk bytes with ReceiveBulk before calling Receive again.
struct Message {
  uint16_t type = 0;
  std::string payload;
  uint64_t bulk_bytes = 0;
};

// Where bulk bytes come from: memory the caller keeps alive for the call, or a
// byte range of an open file descriptor (not modified, its offset untouched).
struct BulkSource {
  std::string_view memory;
  int fd = -1;
  uint64_t file_offset = 0;
  uint64_t file_length = 0;

  static BulkSource FromMemory(std::string_view bytes) { return BulkSource{bytes, -1, 0, 0}; }
  static BulkSource FromFile(int fd, uint64_t offset, uint64_t length) {
    return BulkSource{{}, fd, offset, length};
  }
  bool is_file() const { return fd >= 0; }
  uint64_t size() const { return is_file() ? file_length : memory.size(); }
};

// Where bulk bytes go: caller memory of at least `length` bytes, or a file
// descriptor written with pwrite at file_offset (its own offset untouched).
//
// file_write_lock (optional, file sinks; not owned): held around each write
// into the file, never while waiting for the network. Bytes a backend puts
// into the file's pages without a write (rdma:// READs into the mapping of a
// tmpfs file that already covers the range) take no file lock in the kernel
// either, and do not take this one. Writers that share one
// file (rcopy's parallel streams) pass the same mutex, so that they queue
// asleep instead of spinning in the kernel on the file's inode lock: buffered
// writes to one file are serialized there anyway (tmpfs, ext4, xfs), and on
// a machine with few cores the spinning took the CPU the other streams'
// receives needed.
struct BulkSink {
  char* memory = nullptr;
  int fd = -1;
  uint64_t file_offset = 0;
  std::mutex* file_write_lock = nullptr;

  static BulkSink ToMemory(char* buffer) { return BulkSink{buffer, -1, 0, nullptr}; }
  static BulkSink ToFile(int fd, uint64_t offset, std::mutex* write_lock = nullptr) {
    return BulkSink{nullptr, fd, offset, write_lock};
  }
  bool is_file() const { return fd >= 0; }
  // file_write_lock locked, or an empty lock when there is none.
  std::unique_lock<std::mutex> LockFileWrite() const {
    if (file_write_lock == nullptr) return std::unique_lock<std::mutex>();
    return std::unique_lock<std::mutex>(*file_write_lock);
  }
};

struct ConnectionStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;      // payload + bulk bytes, excluding framing
  uint64_t bytes_received = 0;  // payload + bulk bytes, excluding framing
  uint64_t retransmits = 0;     // backends with their own reliability (DPDK)
  // The device carrying the connection where a transport may spread its
  // connections over several (dpdk://: the DPDK port's name); else empty.
  std::string device;
};

class Connection {
 public:
  virtual ~Connection() = default;  // closes (abruptly) if still open

  // Sends one message. Blocks while the backend's in-flight bound is reached.
  virtual Status Send(uint16_t type, std::string_view payload) = 0;

  // Sends messages of `type` with these payloads, in order, exactly as
  // consecutive Send calls would (the receiver cannot tell the difference),
  // but a backend may write them at once (TCP: one sendmsg), and no other
  // sender's message comes between them on backends that override it. On an
  // error, the messages before the failing one may have been sent; the
  // error is what that Send would have returned. The default calls Send.
  virtual Status SendBatch(uint16_t type, const std::vector<std::string_view>& payloads) {
    for (std::string_view p : payloads) {
      Status s = Send(type, p);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }

  // Sends one message announcing bulk.size() bulk bytes, then those bytes.
  // Returns once all bulk bytes are handed to the backend (for files: read).
  virtual Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) = 0;

  // Next message, or an error (see the table above). Closed means an orderly
  // end of stream after the last message.
  virtual Result<Message> Receive(Deadline deadline) = 0;

  // Consumes the next `length` bytes of the pending bulk data into `sink`.
  // REQUIRES: length <= bulk bytes still pending from the last Message.
  // Calls may split a bulk transfer into pieces of any size.
  virtual Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) = 0;

  // Orderly close of the sending side: the peer receives everything sent so
  // far, then Closed. Receiving on this side continues to work.
  virtual Status Shutdown() = 0;

  // Abrupt close; wakes blocked calls (they return Aborted). Idempotent.
  virtual void Close() = 0;

  // Peer as a URI, e.g. "tcp://127.0.0.1:41234".
  virtual std::string peer_uri() const = 0;
  virtual ConnectionStats stats() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Next incoming connection; Timeout when the deadline passes first.
  virtual Result<std::unique_ptr<Connection>> Accept(Deadline deadline) = 0;
  // The bound endpoint, with the real port when port 0 was asked for.
  virtual Endpoint local_endpoint() const = 0;
  // Stops listening; a blocked Accept returns Aborted. Idempotent.
  virtual void Close() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view scheme() const = 0;
  virtual Result<std::unique_ptr<Listener>> Listen(const Endpoint& local) = 0;
  // Unavailable when nothing listens there, Timeout after connect_timeout.
  virtual Result<std::unique_ptr<Connection>> Connect(const Endpoint& remote) = 0;
  // Does now the once-per-process setup that the first Connect to `remote`
  // would otherwise do (dpdk://: bringing up the port; the EAL itself comes
  // up when the transport is created), and sends nothing to the peer. A tool
  // that times a transfer (rcopy) calls it before starting its clock and
  // reports the setup time apart, as perftest and iperf3 leave theirs out.
  // Errors are those the same setup would return from Connect. Default:
  // nothing to do (tcp://, rdma://: their setup is per connection).
  virtual Status Prepare(const Endpoint& remote) {
    (void)remote;
    return Status::Ok();
  }
};

}  // namespace canopy::transport

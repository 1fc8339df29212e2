// Private to the TCP backend: the socket gate shared by listeners and
// connections, and the connection class whose datapath lives in
// tcp_transport_datapath.cc (set-up: tcp_transport.cc).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/clock.h"
#include "base/fd.h"
#include "base/result.h"
#include "base/status.h"
#include "transport/frame.h"
#include "transport/tcp/tls.h"
#include "transport/transport.h"
#include "transport/transport_metrics.h"

namespace canopy::transport::tcp_internal {

// Owns a socket and an eventfd and lets Close() from any thread coexist with
// calls in flight: Close() signals the eventfd (waking every poll that
// includes it) and the descriptors are closed only once no call uses them,
// so a descriptor number is never reused under a running call.
//
// Thread safety: all methods may be called concurrently.
class GatedSocket {
 public:
  GatedSocket(UniqueFd socket, UniqueFd wake);
  ~GatedSocket();
  GatedSocket(const GatedSocket&) = delete;
  GatedSocket& operator=(const GatedSocket&) = delete;

  // Marks a call in progress; false (and nothing to undo) once closed.
  bool Enter();
  void Exit();
  // Idempotent. Wakes waiters; closes the descriptors now or at the last Exit().
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Valid between a successful Enter() and the matching Exit().
  int fd() const { return socket_fd_; }
  int wake_fd() const { return wake_fd_; }

 private:
  void ReleaseLocked();
  std::mutex mu_;
  int users_ = 0;          // guarded by mu_
  bool released_ = false;  // guarded by mu_
  std::atomic<bool> closed_{false};
  int socket_fd_;
  int wake_fd_;
};

// Scope guard for GatedSocket::Enter/Exit.
class GateUse {
 public:
  explicit GateUse(GatedSocket& gate) : gate_(gate), entered_(gate.Enter()) {}
  ~GateUse() {
    if (entered_) gate_.Exit();
  }
  GateUse(const GateUse&) = delete;
  GateUse& operator=(const GateUse&) = delete;
  bool entered() const { return entered_; }

 private:
  GatedSocket& gate_;
  bool entered_;
};

// Waits until `fd` is ready for `events` (POLLIN / POLLOUT; errors and
// hang-ups count as ready), `wake_fd` fires (Aborted) or timeout_ms passes
// (Timeout). timeout_ms < 0 waits forever; wake_fd < 0 means none. Callers
// replace the Timeout/Aborted messages with their own context.
Status WaitReady(int fd, int wake_fd, short events, int timeout_ms);

// "tcp://a.b.c.d:port" / "tcp://[v6]:port" of a socket address.
std::string SockaddrToUri(const void* sockaddr, size_t length);

class TcpConnection final : public Connection {
 public:
  // zero_copy: move file bulk with sendfile/splice (false: pread/send and
  // recv/pwrite through a user-space buffer; the URI's zerocopy=0).
  // tls: the connection's TLS session (tls+tcp://), null for plain TCP.
  // The dialer runs the handshake in Connect (HandshakeNow); an accepted
  // connection runs it on a thread of its own (StartHandshakeThread), so
  // that Accept returns at once and an accept loop never waits on a client;
  // the first Send/Receive waits for it and fails with its error.
  TcpConnection(UniqueFd socket, UniqueFd wake, std::string peer_uri, const TransportOptions& options,
                bool zero_copy, std::unique_ptr<TlsSession> tls = nullptr);
  Status HandshakeNow(Deadline deadline);
  // REQUIRES: a TLS session, called once, right after construction.
  void StartHandshakeThread(std::chrono::milliseconds timeout);
  ~TcpConnection() override;

  Status Send(uint16_t type, std::string_view payload) override;
  // One sendmsg for the whole batch (several when it is large).
  Status SendBatch(uint16_t type, const std::vector<std::string_view>& payloads) override;
  Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) override;
  Result<Message> Receive(Deadline deadline) override;
  Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) override;
  Status Shutdown() override;
  void Close() override;
  std::string peer_uri() const override { return peer_uri_; }
  ConnectionStats stats() const override;

 private:
  const SchemeCounters& counters_ = CountersForScheme("tcp");  // transport_metrics.h
  // ---- send side (send_mu_ held) ----
  Status SendFrame(uint16_t type, std::string_view payload, const BulkSource* bulk);
  // sendmsg until every iovec is written; *progress counts bytes written.
  Status WriteIovecs(iovec* iov, int count, int flags, uint64_t* progress);
  Status SendFileRange(int file_fd, uint64_t offset, uint64_t length, uint64_t* progress);
  Status WaitWritable();

  // ---- receive side (one receiving thread) ----
  size_t buffered() const { return rx_end_ - rx_begin_; }
  // One read(2) into the receive buffer (compacting it first). at_boundary:
  // whether an end of stream here would be an orderly Closed.
  Status FillBuffer(Deadline deadline, bool at_boundary);
  // Reads exactly n bytes into dst: buffered bytes first, then large reads
  // straight into dst, small ones through the buffer.
  Status ReadExactly(char* dst, size_t n, Deadline deadline, uint64_t* progress);
  // One read(2) straight into dst (at most n bytes); returns the count.
  Result<size_t> ReadDirect(char* dst, size_t n, Deadline deadline);
  Status EndOfStream(bool at_boundary);
  // Into sink.fd from sink.file_offset + offset (writes under sink.LockFileWrite()).
  Status BulkToFile(const BulkSink& sink, uint64_t length, Deadline deadline, uint64_t* progress);
  Status BulkToFileBuffered(const BulkSink& sink, uint64_t offset, uint64_t length, Deadline deadline,
                            uint64_t* progress);
  Status EnsurePipe();
  // Error status for a socket syscall failure (errno `err`).
  Status SocketError(int err, std::string_view op) const;

  // ---- TLS (tls_ set) ----
  // Completes the handshake if it has not run yet.
  Status EnsureTls(Deadline deadline);
  // Whether a direction goes through OpenSSL instead of plain socket calls.
  bool user_space_tls_send() const { return tls_ && !tls_->ktls_send(); }
  bool user_space_tls_recv() const { return tls_ && !tls_->ktls_recv(); }
  Status TlsWriteIovecs(iovec* iov, int count, uint64_t* progress);
  Result<size_t> TlsReadDirect(char* dst, size_t n, Deadline deadline);

  GatedSocket gate_;
  std::unique_ptr<TlsSession> tls_;  // after gate_: freed before the socket is closed
  std::thread tls_handshake_thread_;  // listener side; joined by the destructor
  const std::string peer_uri_;
  const TransportOptions options_;
  const bool zero_copy_;

  std::mutex send_mu_;
  bool send_shutdown_ = false;  // guarded by send_mu_
  Status send_broken_;          // guarded by send_mu_: set once a frame was cut short

  // Allocated on the first receive, so send-only connections do not pay for it.
  static constexpr size_t kReceiveBufferSize = 64 << 10;
  // Reads of at least this many bytes go straight to the destination.
  static constexpr size_t kDirectReadMin = 16 << 10;
  std::unique_ptr<char[]> rx_buffer_;
  size_t rx_begin_ = 0;
  size_t rx_end_ = 0;
  bool rx_in_payload_ = false;  // header decoded, payload not complete
  FrameHeader rx_header_;
  std::string rx_payload_;
  size_t rx_payload_filled_ = 0;
  uint64_t rx_bulk_pending_ = 0;
  Status rx_error_;  // sticky: Closed, Unavailable, Corruption, ...
  UniqueFd pipe_read_;
  UniqueFd pipe_write_;
  size_t pipe_capacity_ = 0;
  bool splice_sink_ok_ = true;  // cleared when a sink refuses splice
  // Small frames are gathered here (send_mu_ held) into one TLS record.
  std::string tls_gather_;
  // Staging buffer for file bulk without splice (kCopyBufferSize, lazily).
  static constexpr size_t kCopyBufferSize = 1 << 20;
  // TLS: frames up to this size are sent as one record; writes are cut to
  // kTlsWriteMax per OpenSSL call.
  static constexpr size_t kTlsGatherMax = 16 << 10;
  static constexpr size_t kTlsWriteMax = 256 << 10;
  std::unique_ptr<char[]> copy_buffer_;

  std::atomic<uint64_t> messages_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace canopy::transport::tcp_internal

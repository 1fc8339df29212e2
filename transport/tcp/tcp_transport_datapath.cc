// TCP datapath: framed sends (sendmsg / sendfile), buffered framed receives,
// bulk receive into memory (direct read) or files (splice via a pipe).

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "base/file.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport_impl.h"

namespace canopy::transport::tcp_internal {
namespace {

constexpr size_t kMaxChunk = size_t{1} << 30;  // per sendfile/splice call
constexpr size_t kCopyChunk = size_t{256} << 10;

Status ClosedLocally() { return Status::Aborted("connection was closed locally (Close())"); }

bool IsUnsupportedFdError(int err) {
  return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP || err == ESPIPE;
}

}  // namespace

TcpConnection::TcpConnection(UniqueFd socket, UniqueFd wake, std::string peer_uri,
                             const TransportOptions& options, bool zero_copy, std::unique_ptr<TlsSession> tls)
    : gate_(std::move(socket), std::move(wake)),
      tls_(std::move(tls)),
      peer_uri_(std::move(peer_uri)),
      options_(options),
      zero_copy_(zero_copy) {}

TcpConnection::~TcpConnection() {
  gate_.Close();  // wakes a handshake thread still waiting
  if (tls_handshake_thread_.joinable()) tls_handshake_thread_.join();
}

void TcpConnection::Close() { gate_.Close(); }

ConnectionStats TcpConnection::stats() const {
  ConnectionStats s;
  s.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  return s;
}

Status TcpConnection::SocketError(int err, std::string_view op) const {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ETIMEDOUT || err == EHOSTUNREACH ||
      err == ENETUNREACH || err == ECONNABORTED) {
    // A lost peer is Unavailable whatever the errno (ETIMEDOUT here is the
    // kernel's retransmission timeout, not one of our deadlines).
    return Status::Unavailable(std::string(op) + " " + peer_uri_ + ": " + std::strerror(err));
  }
  return ErrnoStatus(err, std::string(op) + " " + peer_uri_);
}

// ------------------------------------------------------------------------ TLS

Status TcpConnection::HandshakeNow(Deadline deadline) {
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  return EnsureTls(deadline);
}

void TcpConnection::StartHandshakeThread(std::chrono::milliseconds timeout) {
  tls_handshake_thread_ = std::thread([this, timeout] {
    GateUse use(gate_);
    if (!use.entered()) return;
    Status s = tls_->Handshake(gate_.wake_fd(), Deadline::After(timeout), peer_uri_);
    if (!s.ok() && s.code() != StatusCode::kAborted) CANOPY_LOG(kDebug, "tls+tcp: {}", s.ToString());
  });
}

Status TcpConnection::EnsureTls(Deadline deadline) {
  if (!tls_) return Status::Ok();
  return tls_->Handshake(gate_.wake_fd(), deadline, peer_uri_);
}

Status TcpConnection::TlsWriteIovecs(iovec* iov, int count, uint64_t* progress) {
  // Gather a small message (header + payload) into one record instead of two.
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  iovec gathered;
  if (count > 1 && total <= kTlsGatherMax) {
    tls_gather_.clear();
    for (int i = 0; i < count; ++i) tls_gather_.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
    gathered = iovec{tls_gather_.data(), tls_gather_.size()};
    iov = &gathered;
    count = 1;
  }
  for (int i = 0; i < count; ++i) {
    const char* data = static_cast<const char*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left > 0) {
      size_t done = 0;
      Status error;
      // Bounded pieces, so that the receiving thread never waits long for the session.
      switch (tls_->Write(data, std::min(left, kTlsWriteMax), &done, &error, peer_uri_)) {
        case TlsIo::kDone:
          data += done;
          left -= done;
          *progress += done;
          break;
        case TlsIo::kWantWrite:
          CANOPY_RETURN_IF_ERROR(WaitWritable());
          break;
        case TlsIo::kWantRead: {
          Status s = WaitReady(gate_.fd(), gate_.wake_fd(), POLLIN, 100);
          if (s.code() == StatusCode::kAborted) return ClosedLocally();
          break;
        }
        case TlsIo::kClosed:
          return Status::Unavailable("send to " + peer_uri_ + ": the peer ended the TLS session");
        case TlsIo::kFailed: {
          // A peer that refused us (e.g. our certificate) said why before it reset.
          Status refusal = tls_->PeerRefusal(peer_uri_);
          return refusal.ok() ? error : refusal;
        }
      }
    }
  }
  return Status::Ok();
}

Result<size_t> TcpConnection::TlsReadDirect(char* dst, size_t n, Deadline deadline) {
  for (;;) {
    size_t done = 0;
    Status error;
    short wait_for = POLLIN;
    switch (tls_->Read(dst, n, &done, &error, peer_uri_)) {
      case TlsIo::kDone: return done;
      case TlsIo::kClosed: return Status::Closed("");  // caller decides Closed vs Unavailable
      case TlsIo::kFailed:
        rx_error_ = error;
        return rx_error_;
      case TlsIo::kWantWrite: wait_for = POLLOUT; break;
      case TlsIo::kWantRead: break;
    }
    Status s = WaitReady(gate_.fd(), gate_.wake_fd(), wait_for, deadline.poll_timeout_ms());
    if (s.IsTimeout()) return Status::Timeout("receive from " + peer_uri_ + ": deadline passed");
    if (s.code() == StatusCode::kAborted) return ClosedLocally();
    CANOPY_RETURN_IF_ERROR(s);
  }
}

// ------------------------------------------------------------------ send side

Status TcpConnection::Send(uint16_t type, std::string_view payload) {
  Status s = SendFrame(type, payload, nullptr);
  if (s.ok()) counters_.bytes_sent->Increment(static_cast<double>(payload.size()));
  return s;
}

Status TcpConnection::SendBatch(uint16_t type, const std::vector<std::string_view>& payloads) {
  if (payloads.size() <= 1) return payloads.empty() ? Status::Ok() : Send(type, payloads.front());
  for (std::string_view p : payloads) {
    if (p.size() > options_.max_message_bytes) {
      return Status::InvalidArgument("message payload of " + std::to_string(p.size()) +
                                     " bytes exceeds max_message_bytes " +
                                     std::to_string(options_.max_message_bytes));
    }
  }
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  CANOPY_RETURN_IF_ERROR(EnsureTls(Deadline::After(options_.io_timeout)));
  std::lock_guard<std::mutex> lock(send_mu_);
  if (gate_.closed()) return ClosedLocally();
  if (send_shutdown_) return Status::InvalidArgument("Send after Shutdown() on connection to " + peer_uri_);
  if (!send_broken_.ok()) return send_broken_;
  // Up to kFramesPerWrite frames (a header and a payload each) per sendmsg.
  constexpr size_t kFramesPerWrite = 64;
  std::vector<char> headers(std::min(payloads.size(), kFramesPerWrite) * kFrameHeaderSize);
  std::vector<iovec> iov;
  iov.reserve(2 * std::min(payloads.size(), kFramesPerWrite));
  for (size_t first = 0; first < payloads.size(); first += kFramesPerWrite) {
    const size_t n = std::min(kFramesPerWrite, payloads.size() - first);
    iov.clear();
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      std::string_view p = payloads[first + i];
      char* header = headers.data() + i * kFrameHeaderSize;
      EncodeFrameHeader(header, type, p, 0);
      iov.push_back(iovec{header, kFrameHeaderSize});
      if (!p.empty()) iov.push_back(iovec{const_cast<char*>(p.data()), p.size()});
      bytes += p.size();
    }
    uint64_t progress = 0;
    Status s = WriteIovecs(iov.data(), static_cast<int>(iov.size()), 0, &progress);
    if (!s.ok()) {
      if (progress > 0 && !gate_.closed()) {
        // As SendFrame: part of a frame may be on the wire.
        send_broken_ = Status(s.code(), s.message() +
                                            " (after part of a message was sent; the connection can no "
                                            "longer send)");
        ::shutdown(gate_.fd(), SHUT_WR);
      }
      return s;
    }
    messages_sent_.fetch_add(n, std::memory_order_relaxed);
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
    counters_.bytes_sent->Increment(static_cast<double>(bytes));
  }
  return Status::Ok();
}

Status TcpConnection::SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) {
  Status s = SendFrame(type, payload, &bulk);
  if (s.ok()) counters_.bytes_sent->Increment(static_cast<double>(payload.size() + bulk.size()));
  return s;
}

Status TcpConnection::WaitWritable() {
  auto timeout_ms = options_.io_timeout.count();
  int ms = timeout_ms <= 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout_ms, 1'000'000'000));
  Status s = WaitReady(gate_.fd(), gate_.wake_fd(), POLLOUT, ms);
  if (s.IsTimeout()) {
    return Status::Timeout("send to " + peer_uri_ + " made no progress for " + std::to_string(timeout_ms) +
                           " ms (receiver not reading?)");
  }
  if (s.code() == StatusCode::kAborted) return ClosedLocally();
  return s;
}

Status TcpConnection::WriteIovecs(iovec* iov, int count, int flags, uint64_t* progress) {
  if (user_space_tls_send()) return TlsWriteIovecs(iov, count, progress);
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(gate_.fd(), &msg, flags | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        CANOPY_RETURN_IF_ERROR(WaitWritable());
        continue;
      }
      return SocketError(errno, "send to");
    }
    *progress += static_cast<uint64_t>(n);
    auto left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Status::Ok();
}

Status TcpConnection::SendFileRange(int file_fd, uint64_t offset, uint64_t length, uint64_t* progress) {
  bool use_sendfile = zero_copy_ && !user_space_tls_send();  // kTLS encrypts what sendfile sends
  std::vector<char> scratch;
  uint64_t done = 0;
  while (done < length) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, kMaxChunk));
    if (use_sendfile) {
      off_t off = static_cast<off_t>(offset + done);
      ssize_t n = ::sendfile(gate_.fd(), file_fd, &off, want);
      if (n > 0) {
        done += static_cast<uint64_t>(n);
        *progress += static_cast<uint64_t>(n);
        continue;
      }
      if (n == 0) {
        return Status::IOError("bulk source file ended " + std::to_string(length - done) +
                               " bytes before the announced length");
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        CANOPY_RETURN_IF_ERROR(WaitWritable());
        continue;
      }
      if (IsUnsupportedFdError(errno)) {  // e.g. a pipe or a file system without splice support
        use_sendfile = false;
        continue;
      }
      return SocketError(errno, "sendfile to");
    }
    // Fallback: pread into a scratch buffer, then send it.
    if (scratch.empty()) scratch.resize(kCopyChunk);
    want = std::min(want, scratch.size());
    ssize_t n = ::pread(file_fd, scratch.data(), want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read bulk source file");
    }
    if (n == 0) {
      return Status::IOError("bulk source file ended " + std::to_string(length - done) +
                             " bytes before the announced length");
    }
    iovec iov{scratch.data(), static_cast<size_t>(n)};
    CANOPY_RETURN_IF_ERROR(WriteIovecs(&iov, 1, 0, progress));
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status TcpConnection::SendFrame(uint16_t type, std::string_view payload, const BulkSource* bulk) {
  if (payload.size() > options_.max_message_bytes) {
    return Status::InvalidArgument("message payload of " + std::to_string(payload.size()) +
                                   " bytes exceeds max_message_bytes " +
                                   std::to_string(options_.max_message_bytes));
  }
  if (bulk != nullptr && bulk->is_file() && bulk->file_length > 0) {
    struct stat st {};
    if (::fstat(bulk->fd, &st) != 0) return ErrnoStatus(errno, "fstat bulk source file");
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
      return Status::InvalidArgument(
          "bulk source must be a regular file or a block device (it is read at an offset)");
    }
    const auto file_size = static_cast<uint64_t>(st.st_size);
    if (S_ISREG(st.st_mode) &&
        (bulk->file_length > file_size || bulk->file_offset > file_size - bulk->file_length)) {
      return Status::InvalidArgument("bulk source range [" + std::to_string(bulk->file_offset) + ", +" +
                                     std::to_string(bulk->file_length) +
                                     ") extends past the end of the file (" + std::to_string(st.st_size) +
                                     " bytes)");
    }
  }
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  CANOPY_RETURN_IF_ERROR(EnsureTls(Deadline::After(options_.io_timeout)));
  std::lock_guard<std::mutex> lock(send_mu_);
  if (gate_.closed()) return ClosedLocally();
  if (send_shutdown_) return Status::InvalidArgument("Send after Shutdown() on connection to " + peer_uri_);
  if (!send_broken_.ok()) return send_broken_;

  const uint64_t bulk_len = bulk != nullptr ? bulk->size() : 0;
  char header[kFrameHeaderSize];
  EncodeFrameHeader(header, type, payload, bulk_len);
  iovec iov[3];
  int count = 0;
  iov[count++] = iovec{header, kFrameHeaderSize};
  if (!payload.empty()) iov[count++] = iovec{const_cast<char*>(payload.data()), payload.size()};
  const bool file_bulk = bulk != nullptr && bulk->is_file() && bulk_len > 0;
  if (bulk != nullptr && !bulk->is_file() && bulk_len > 0) {
    iov[count++] = iovec{const_cast<char*>(bulk->memory.data()), bulk->memory.size()};
  }
  uint64_t progress = 0;
  Status s = WriteIovecs(iov, count, file_bulk ? MSG_MORE : 0, &progress);
  if (s.ok() && file_bulk) s = SendFileRange(bulk->fd, bulk->file_offset, bulk->file_length, &progress);
  if (!s.ok()) {
    if (progress > 0 && !gate_.closed()) {
      // Part of the frame is on the wire: the stream cannot carry another
      // frame. End it so that the peer sees a cut message (Unavailable)
      // instead of waiting forever.
      send_broken_ = Status(s.code(), s.message() +
                                          " (after part of a message was sent; the connection can no "
                                          "longer send)");
      ::shutdown(gate_.fd(), SHUT_WR);
    }
    return s;
  }
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(payload.size() + bulk_len, std::memory_order_relaxed);
  return Status::Ok();
}

Status TcpConnection::Shutdown() {
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  std::lock_guard<std::mutex> lock(send_mu_);  // after any send in progress
  if (gate_.closed()) return ClosedLocally();
  if (send_shutdown_) return Status::Ok();
  send_shutdown_ = true;
  if (tls_) tls_->SendCloseNotify();
  if (::shutdown(gate_.fd(), SHUT_WR) != 0 && errno != ENOTCONN) return SocketError(errno, "shutdown of");
  return Status::Ok();
}

// --------------------------------------------------------------- receive side

Status TcpConnection::EndOfStream(bool at_boundary) {
  if (at_boundary) {
    rx_error_ = Status::Closed("peer " + peer_uri_ + " closed the connection");
  } else {
    rx_error_ =
        Status::Unavailable("peer " + peer_uri_ + " closed the connection in the middle of a message");
  }
  return rx_error_;
}

Result<size_t> TcpConnection::ReadDirect(char* dst, size_t n, Deadline deadline) {
  if (user_space_tls_recv()) return TlsReadDirect(dst, n, deadline);
  for (;;) {
    ssize_t r = ::recv(gate_.fd(), dst, n, 0);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) return Status::Closed("");  // caller decides Closed vs Unavailable
    if (errno == EINTR) continue;
    // Kernel TLS receive: a record that is not data (close_notify, an
    // alert) makes recv fail with EIO; OpenSSL reads and interprets it.
    if (errno == EIO && tls_) return TlsReadDirect(dst, n, deadline);
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      rx_error_ = SocketError(errno, "receive from");
      return rx_error_;
    }
    Status s = WaitReady(gate_.fd(), gate_.wake_fd(), POLLIN, deadline.poll_timeout_ms());
    if (s.IsTimeout()) return Status::Timeout("receive from " + peer_uri_ + ": deadline passed");
    if (s.code() == StatusCode::kAborted) return ClosedLocally();
    CANOPY_RETURN_IF_ERROR(s);
  }
}

Status TcpConnection::FillBuffer(Deadline deadline, bool at_boundary) {
  if (!rx_buffer_) rx_buffer_.reset(new char[kReceiveBufferSize]);
  if (rx_begin_ > 0) {
    std::memmove(rx_buffer_.get(), rx_buffer_.get() + rx_begin_, buffered());
    rx_end_ -= rx_begin_;
    rx_begin_ = 0;
  }
  auto n = ReadDirect(rx_buffer_.get() + rx_end_, kReceiveBufferSize - rx_end_, deadline);
  if (!n.ok()) {
    if (n.status().IsClosed() && rx_error_.ok()) return EndOfStream(at_boundary && buffered() == 0);
    return n.status();
  }
  rx_end_ += *n;
  return Status::Ok();
}

Status TcpConnection::ReadExactly(char* dst, size_t n, Deadline deadline, uint64_t* progress) {
  size_t done = 0;
  while (done < n) {
    if (buffered() > 0) {
      size_t take = std::min(buffered(), n - done);
      std::memcpy(dst + done, rx_buffer_.get() + rx_begin_, take);
      rx_begin_ += take;
      done += take;
      *progress += take;
      continue;
    }
    if (n - done >= kDirectReadMin) {
      auto r = ReadDirect(dst + done, n - done, deadline);
      if (!r.ok()) {
        if (r.status().IsClosed() && rx_error_.ok()) return EndOfStream(false);
        return r.status();
      }
      done += *r;
      *progress += *r;
    } else {
      CANOPY_RETURN_IF_ERROR(FillBuffer(deadline, false));
    }
  }
  return Status::Ok();
}

Result<Message> TcpConnection::Receive(Deadline deadline) {
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  if (!rx_error_.ok()) return rx_error_;
  CANOPY_RETURN_IF_ERROR(EnsureTls(deadline));
  if (rx_bulk_pending_ > 0) {
    return Status::InvalidArgument("Receive called with " + std::to_string(rx_bulk_pending_) +
                                   " bulk bytes of the previous message not consumed (use ReceiveBulk)");
  }
  if (!rx_in_payload_) {
    while (buffered() < kFrameHeaderSize) CANOPY_RETURN_IF_ERROR(FillBuffer(deadline, buffered() == 0));
    auto header = DecodeFrameHeader(std::string_view(rx_buffer_.get() + rx_begin_, kFrameHeaderSize),
                                    options_.max_message_bytes);
    if (!header.ok()) {
      rx_error_ = header.status().WithContext("frame from " + peer_uri_);
      return rx_error_;
    }
    rx_begin_ += kFrameHeaderSize;
    rx_header_ = *header;
    rx_payload_.clear();
    // Capacity for the announced length, up to kPayloadReserveMax (frame.h).
    rx_payload_.reserve(std::min<size_t>(rx_header_.payload_len, kPayloadReserveMax));
    rx_payload_filled_ = 0;
    rx_in_payload_ = true;
  }
  // The buffer's size (the bytes zeroed, so touched) grows with the bytes
  // that arrive, never to the announced length up front: a header alone
  // must not make us allocate and zero up to max_message_bytes per
  // connection. It at least doubles, and jumps to cover every byte already
  // here (buffered, or queued in the socket). Within the reserved capacity
  // growing copies nothing; past it (messages above kPayloadReserveMax) the
  // doubling keeps the copies to about one per byte.
  while (rx_payload_filled_ < rx_header_.payload_len) {
    const size_t floor = std::max<size_t>(rx_payload_filled_ * 2, size_t{64} << 10);
    size_t target = rx_header_.payload_len;
    if (target > floor) {  // else it is all read at once anyway: no need to ask what is queued
      int queued = 0;
      if (::ioctl(gate_.fd(), FIONREAD, &queued) != 0 || queued < 0) queued = 0;
      const size_t arrived = rx_payload_filled_ + buffered() + static_cast<size_t>(queued);
      target = std::min<size_t>(target, std::max(floor, arrived));
    }
    if (rx_payload_.size() < target) rx_payload_.resize(target);
    uint64_t progress = 0;
    Status s = ReadExactly(rx_payload_.data() + rx_payload_filled_, target - rx_payload_filled_, deadline, &progress);
    rx_payload_filled_ += progress;
    CANOPY_RETURN_IF_ERROR(s);  // a Timeout keeps the partial payload for the next call
  }
  rx_in_payload_ = false;
  Status verified = VerifyFramePayload(rx_header_, rx_payload_);
  if (!verified.ok()) {
    rx_error_ = verified.WithContext("frame from " + peer_uri_);
    return rx_error_;
  }
  Message message;
  message.type = rx_header_.type;
  message.payload = std::move(rx_payload_);
  message.bulk_bytes = rx_header_.bulk_len;
  rx_payload_.clear();
  rx_bulk_pending_ = rx_header_.bulk_len;
  messages_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(message.payload.size(), std::memory_order_relaxed);
  counters_.bytes_received->Increment(static_cast<double>(message.payload.size()));
  return message;
}

Status TcpConnection::EnsurePipe() {
  if (pipe_read_.valid()) return Status::Ok();
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2 for splice");
  pipe_read_.Reset(fds[0]);
  pipe_write_.Reset(fds[1]);
  // Larger pipes mean fewer splice calls; the kernel caps this at
  // fs.pipe-max-size for unprivileged processes, so failure is fine.
  int want = static_cast<int>(std::clamp<size_t>(options_.buffer_bytes, 64 << 10, 1 << 20));
  (void)::fcntl(fds[1], F_SETPIPE_SZ, want);
  int size = ::fcntl(fds[1], F_GETPIPE_SZ);
  pipe_capacity_ = size > 0 ? static_cast<size_t>(size) : 64 << 10;
  return Status::Ok();
}

Status TcpConnection::BulkToFileBuffered(const BulkSink& sink, uint64_t offset, uint64_t length,
                                         Deadline deadline, uint64_t* progress) {
  const uint64_t base = sink.file_offset + offset;
  uint64_t done = 0;
  while (done < length) {
    if (buffered() > 0) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(buffered(), length - done));
      {
        auto write_lock = sink.LockFileWrite();
        CANOPY_RETURN_IF_ERROR(
            PwriteAll(sink.fd, rx_buffer_.get() + rx_begin_, take, base + done, "write bulk data"));
      }
      rx_begin_ += take;
      done += take;
      *progress += take;
      continue;
    }
    if (length - done < kDirectReadMin) {
      CANOPY_RETURN_IF_ERROR(FillBuffer(deadline, false));
      continue;
    }
    // Large remainder: read up to kCopyBufferSize at once (never past the bulk).
    if (!copy_buffer_) copy_buffer_.reset(new char[kCopyBufferSize]);
    size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, kCopyBufferSize));
    auto n = ReadDirect(copy_buffer_.get(), want, deadline);
    if (!n.ok()) {
      if (n.status().IsClosed() && rx_error_.ok()) return EndOfStream(false);
      return n.status();
    }
    {
      auto write_lock = sink.LockFileWrite();
      CANOPY_RETURN_IF_ERROR(PwriteAll(sink.fd, copy_buffer_.get(), *n, base + done, "write bulk data"));
    }
    done += *n;
    *progress += *n;
  }
  return Status::Ok();
}

Status TcpConnection::BulkToFile(const BulkSink& sink, uint64_t length, Deadline deadline,
                                 uint64_t* progress) {
  // Splicing from the socket needs the plain stream (TCP, or kernel TLS).
  if (!zero_copy_ || user_space_tls_recv()) return BulkToFileBuffered(sink, 0, length, deadline, progress);
  const int fd = sink.fd;
  const uint64_t offset = sink.file_offset;
  uint64_t done = 0;
  // Bytes already in the receive buffer go out with pwrite.
  if (buffered() > 0) {
    uint64_t take = std::min<uint64_t>(buffered(), length);
    CANOPY_RETURN_IF_ERROR(BulkToFileBuffered(sink, 0, take, deadline, progress));
    done += take;
  }
  if (done < length && splice_sink_ok_) CANOPY_RETURN_IF_ERROR(EnsurePipe());
  while (done < length && splice_sink_ok_) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, pipe_capacity_));
    ssize_t n =
        ::splice(gate_.fd(), nullptr, pipe_write_.get(), nullptr, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n == 0) return EndOfStream(false);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Status s = WaitReady(gate_.fd(), gate_.wake_fd(), POLLIN, deadline.poll_timeout_ms());
        if (s.IsTimeout())
          return Status::Timeout("receive bulk data from " + peer_uri_ + ": deadline passed");
        if (s.code() == StatusCode::kAborted) return ClosedLocally();
        CANOPY_RETURN_IF_ERROR(s);
        continue;
      }
      if (IsUnsupportedFdError(errno)) {
        splice_sink_ok_ = false;
        break;
      }
      rx_error_ = SocketError(errno, "receive bulk data from");
      return rx_error_;
    }
    // Drain the pipe into the file (under the sink's write lock: the pipe
    // already holds the bytes, so no network wait happens inside it).
    auto in_pipe = static_cast<size_t>(n);
    auto write_lock = sink.LockFileWrite();
    while (in_pipe > 0) {
      loff_t off = static_cast<loff_t>(offset + done);
      ssize_t w =
          splice_sink_ok_ ? ::splice(pipe_read_.get(), nullptr, fd, &off, in_pipe, SPLICE_F_MOVE) : -1;
      if (w > 0) {
        done += static_cast<uint64_t>(w);
        *progress += static_cast<uint64_t>(w);
        in_pipe -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && splice_sink_ok_ && !IsUnsupportedFdError(errno) && errno != EBADF) {
        return ErrnoStatus(errno, "write bulk data");
      }
      // The sink cannot be spliced into (O_APPEND, some file systems):
      // move what sits in the pipe with read + pwrite, then stop splicing.
      splice_sink_ok_ = false;
      char chunk[16 << 10];
      ssize_t r = ::read(pipe_read_.get(), chunk, std::min(in_pipe, sizeof(chunk)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Status::Internal("could not drain the splice pipe");
      CANOPY_RETURN_IF_ERROR(PwriteAll(fd, chunk, static_cast<size_t>(r), offset + done, "write bulk data"));
      done += static_cast<uint64_t>(r);
      *progress += static_cast<uint64_t>(r);
      in_pipe -= static_cast<size_t>(r);
    }
  }
  if (done < length) {
    CANOPY_RETURN_IF_ERROR(BulkToFileBuffered(sink, done, length - done, deadline, progress));
  }
  return Status::Ok();
}

Status TcpConnection::ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) {
  GateUse use(gate_);
  if (!use.entered()) return ClosedLocally();
  if (!rx_error_.ok()) return rx_error_;
  if (length > rx_bulk_pending_) {
    return Status::InvalidArgument("ReceiveBulk of " + std::to_string(length) + " bytes, but only " +
                                   std::to_string(rx_bulk_pending_) + " bulk bytes are pending");
  }
  if (length == 0) return Status::Ok();
  if (!sink.is_file() && sink.memory == nullptr)
    return Status::InvalidArgument("ReceiveBulk into a null buffer");
  uint64_t progress = 0;
  Status s = sink.is_file() ? BulkToFile(sink, length, deadline, &progress)
                            : ReadExactly(sink.memory, static_cast<size_t>(length), deadline, &progress);
  counters_.bytes_received->Increment(static_cast<double>(progress));
  if (!s.ok()) {
    if (progress > 0 && rx_error_.ok() && s.code() != StatusCode::kAborted) {
      // The caller cannot know how much was consumed: the stream position is lost.
      rx_error_ = Status(s.code(), s.message() +
                                       " (part-way through bulk data; the connection can no longer "
                                       "receive)");
      return rx_error_;
    }
    return s;
  }
  rx_bulk_pending_ -= length;
  bytes_received_.fetch_add(length, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace canopy::transport::tcp_internal

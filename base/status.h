// Status: the outcome of an operation, as a value.
//
// canopy never throws across a module boundary. A function that can fail
// returns a Status (or a Result<T>, see result.h); the caller checks ok().
// A Status is cheap to copy when ok (no allocation) and carries a code and a
// human-readable message otherwise. The message says what failed and why, in
// words a user can act on ("open /x/wal-000001.log: No space left on device").
//
// Thread safety: a Status is an immutable value; distinct objects may be used
// from distinct threads freely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace canopy {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,    // the caller passed something malformed
  kNotFound = 2,           // a named thing does not exist
  kCorruption = 3,         // bytes failed a check (CRC, magic, bounds)
  kIOError = 4,            // the OS refused an I/O operation
  kUnavailable = 5,        // peer unreachable, connection closed, service down
  kTimeout = 6,            // a deadline passed before the operation finished
  kNotSupported = 7,       // feature not built in or not available here
  kConflict = 8,           // stale base version, epoch fencing, lost race
  kAlreadyExists = 9,      // creating something that is already there
  kResourceExhausted = 10, // disk full, file size limit, too many connections
  kPermissionDenied = 11,  // EACCES/EPERM, authentication refused
  kAborted = 12,           // operation cancelled (shutdown in progress)
  kInternal = 13,          // a bug: an invariant did not hold
  kClosed = 14,            // the peer closed the stream in an orderly way (end of stream)
};

// Name of a code, e.g. "Corruption". Never returns null.
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // OK
  Status(StatusCode code, std::string_view message);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string_view m) { return {StatusCode::kInvalidArgument, m}; }
  static Status NotFound(std::string_view m) { return {StatusCode::kNotFound, m}; }
  static Status Corruption(std::string_view m) { return {StatusCode::kCorruption, m}; }
  static Status IOError(std::string_view m) { return {StatusCode::kIOError, m}; }
  static Status Unavailable(std::string_view m) { return {StatusCode::kUnavailable, m}; }
  static Status Timeout(std::string_view m) { return {StatusCode::kTimeout, m}; }
  static Status NotSupported(std::string_view m) { return {StatusCode::kNotSupported, m}; }
  static Status Conflict(std::string_view m) { return {StatusCode::kConflict, m}; }
  static Status AlreadyExists(std::string_view m) { return {StatusCode::kAlreadyExists, m}; }
  static Status ResourceExhausted(std::string_view m) { return {StatusCode::kResourceExhausted, m}; }
  static Status PermissionDenied(std::string_view m) { return {StatusCode::kPermissionDenied, m}; }
  static Status Aborted(std::string_view m) { return {StatusCode::kAborted, m}; }
  static Status Internal(std::string_view m) { return {StatusCode::kInternal, m}; }
  static Status Closed(std::string_view m) { return {StatusCode::kClosed, m}; }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty when ok.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a Status with the same code and "<context>: <message>".
  // An ok Status stays ok; an empty context adds nothing.
  Status WithContext(std::string_view context) const;

  bool IsCorruption() const { return code() == StatusCode::kCorruption; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsTimeout() const { return code() == StatusCode::kTimeout; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }
  bool IsConflict() const { return code() == StatusCode::kConflict; }
  bool IsClosed() const { return code() == StatusCode::kClosed; }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null == OK; shared so copies are cheap
};

// Maps an errno value to a Status with "<context>: <strerror>" as message:
// ENOSPC/EFBIG/EDQUOT -> ResourceExhausted, EACCES/EPERM -> PermissionDenied,
// ENOENT -> NotFound, EEXIST -> AlreadyExists, ETIMEDOUT -> Timeout,
// ECONNREFUSED/ECONNRESET/EPIPE/EHOSTUNREACH/ENETUNREACH -> Unavailable,
// EINVAL -> InvalidArgument, anything else -> IOError.
Status ErrnoStatus(int err, std::string_view context);

}  // namespace canopy

// Propagates a non-ok Status out of the enclosing function.
#define CANOPY_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::canopy::Status canopy_status_tmp_ = (expr);     \
    if (!canopy_status_tmp_.ok()) return canopy_status_tmp_; \
  } while (0)

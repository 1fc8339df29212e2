#include "base/status.h"

#include <cerrno>
#include <cstring>

namespace canopy {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kConflict: return "Conflict";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kClosed: return "Closed";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string_view message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::string(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out = StatusCodeName(code());
  out += ": ";
  out += state_->message;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += state_->message;
  return Status(code(), msg);
}

Status ErrnoStatus(int err, std::string_view context) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EFBIG:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return Status::ResourceExhausted(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return Status::PermissionDenied(msg);
    case ENOENT:
      return Status::NotFound(msg);
    case EEXIST:
      return Status::AlreadyExists(msg);
    case ETIMEDOUT:
      return Status::Timeout(msg);
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENOTCONN:
      return Status::Unavailable(msg);
    case EINVAL:
      return Status::InvalidArgument(msg);
    default:
      return Status::IOError(msg);
  }
}

}  // namespace canopy

// Result<T>: either a value of type T or a non-ok Status (StatusOr-like).
//
//   Result<Tree> r = store.Open("t");
//   if (!r.ok()) return r.status();
//   Tree& t = *r;
//
// Constructing a Result from an ok Status is a bug: it is turned into an
// Internal error so the caller never reads a value that is not there.
// Accessing value() of a failed Result aborts the process (a bug, not an
// error path): check ok() first.
//
// Thread safety: like the T it holds.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "base/status.h"

namespace canopy {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& value) : value_(value) {}                 // NOLINT: implicit by design
  Result(T&& value) : value_(std::move(value)) {}           // NOLINT
  Result(Status status) : status_(std::move(status)) {      // NOLINT
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status");
  }
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                     !std::is_same_v<std::decay_t<U>, Status> &&
                                                     !std::is_same_v<std::decay_t<U>, T>>>
  Result(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { Check(); return *value_; }
  const T& value() const& { Check(); return *value_; }
  T&& value() && { Check(); return std::move(*value_); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The value, or `fallback` when failed.
  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  void Check() const {
    if (!value_.has_value()) {
      std::fprintf(stderr, "canopy: value() of failed Result: %s\n", status_.ToString().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;  // OK when value_ is set
};

}  // namespace canopy

#define CANOPY_CONCAT_INNER_(a, b) a##b
#define CANOPY_CONCAT_(a, b) CANOPY_CONCAT_INNER_(a, b)

// CANOPY_ASSIGN_OR_RETURN(auto x, Foo());  declares x from a Result, or returns its Status.
#define CANOPY_ASSIGN_OR_RETURN(lhs, expr) \
  CANOPY_ASSIGN_OR_RETURN_IMPL_(CANOPY_CONCAT_(canopy_result_, __LINE__), lhs, expr)
#define CANOPY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

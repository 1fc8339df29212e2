// RefPtr<T>: an 8-byte intrusive reference-counted pointer.
//
// T keeps its own count (a `mutable std::atomic<uint32_t> refs_`-style
// member) and the pair of free functions
//   void RefAdd(const T* p) noexcept;      // one more reference
//   void RefRelease(const T* p) noexcept;  // one fewer; frees p at zero
// found by argument-dependent lookup. Compared with std::shared_ptr there is
// no separate control block and the handle is one pointer, which is what lets
// a tree node cost tens of bytes rather than a hundred and more.
//
// unique() (the count is exactly 1) is what path copying uses to decide that
// an object may be edited in place: only the holder of the sole reference can
// observe it.
//
// Thread safety: as std::shared_ptr — one RefPtr object is not safe to write
// from two threads, but different RefPtrs to one object are.
#pragma once

#include <cstddef>
#include <utility>

namespace canopy::tree {

template <typename T>
class RefPtr {
 public:
  RefPtr() noexcept = default;
  RefPtr(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor)
  // Adopts `p` without adding a reference (p's count already includes this one).
  static RefPtr Adopt(T* p) noexcept {
    RefPtr r;
    r.p_ = p;
    return r;
  }
  // Takes a new reference to `p`.
  explicit RefPtr(T* p) noexcept : p_(p) {
    if (p_) RefAdd(p_);
  }
  RefPtr(const RefPtr& o) noexcept : p_(o.p_) {
    if (p_) RefAdd(p_);
  }
  RefPtr(RefPtr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  RefPtr& operator=(const RefPtr& o) noexcept {
    RefPtr(o).swap(*this);
    return *this;
  }
  RefPtr& operator=(RefPtr&& o) noexcept {
    RefPtr(std::move(o)).swap(*this);
    return *this;
  }
  ~RefPtr() {
    if (p_) RefRelease(p_);
  }

  void swap(RefPtr& o) noexcept { std::swap(p_, o.p_); }
  void reset() noexcept { RefPtr().swap(*this); }
  // Gives up ownership without releasing; the caller now owns one reference.
  T* release() noexcept { return std::exchange(p_, nullptr); }

  T* get() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  T* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

  friend bool operator==(const RefPtr& a, const RefPtr& b) noexcept { return a.p_ == b.p_; }
  friend bool operator==(const RefPtr& a, std::nullptr_t) noexcept { return a.p_ == nullptr; }

 private:
  T* p_ = nullptr;
};

}  // namespace canopy::tree

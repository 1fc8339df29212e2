#include "tree/xxh3.h"

#include <xxhash.h>

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) && defined(__GNUC__)
// The library's runtime-dispatched XXH3 (the fastest form libxxhash knows of
// for this CPU), for CPUs without AVX2.
#include <xxh_x86dispatch.h>
#define CANOPY_XXH3_UPDATE XXH3_64bits_update_dispatch
#define CANOPY_XXH3_AVX2 1
#include "tree/xxh3_avx2.h"
#else
#define CANOPY_XXH3_UPDATE XXH3_64bits_update
#endif

namespace canopy::tree {

namespace {
std::atomic<bool> avx2_allowed{true};
}  // namespace

bool Xxh3UsesAvx2() {
#ifdef CANOPY_XXH3_AVX2
  static const bool has = __builtin_cpu_supports("avx2");
  return has && avx2_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void AllowXxh3Avx2(bool allowed) { avx2_allowed.store(allowed, std::memory_order_relaxed); }

Xxh3::Xxh3() : avx2_(Xxh3UsesAvx2()) {
#ifdef CANOPY_XXH3_AVX2
  if (avx2_) {
    state_ = xxh3_avx2::NewState();
    return;
  }
#endif
  XXH3_state_t* s = XXH3_createState();
  if (s == nullptr) std::abort();
  XXH3_64bits_reset(s);
  state_ = s;
}

Xxh3::~Xxh3() {
#ifdef CANOPY_XXH3_AVX2
  if (avx2_) {
    xxh3_avx2::FreeState(state_);
    return;
  }
#endif
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Xxh3::Update(const void* p, size_t n) {
#ifdef CANOPY_XXH3_AVX2
  if (avx2_) {
    xxh3_avx2::Update(state_, p, n);
    return;
  }
#endif
  CANOPY_XXH3_UPDATE(static_cast<XXH3_state_t*>(state_), p, n);
}

uint64_t Xxh3::Digest() const {
#ifdef CANOPY_XXH3_AVX2
  if (avx2_) return xxh3_avx2::Digest(state_);
#endif
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace canopy::tree

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

// One form of XXH3: its state's lifetime, updates and digest.
struct Xxh3::Form {
  void* (*new_state)();
  void (*free_state)(void*);
  void (*update)(void*, const void*, size_t);
  uint64_t (*digest)(const void*);
};

namespace {

std::atomic<bool> avx2_allowed{true};

const Xxh3::Form kLibraryForm{
    []() -> void* {
      XXH3_state_t* s = XXH3_createState();
      if (s == nullptr) std::abort();
      XXH3_64bits_reset(s);
      return s;
    },
    [](void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); },
    [](void* state, const void* p, size_t n) { CANOPY_XXH3_UPDATE(static_cast<XXH3_state_t*>(state), p, n); },
    [](const void* state) -> uint64_t { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state)); },
};

#ifdef CANOPY_XXH3_AVX2
const Xxh3::Form kAvx2Form{xxh3_avx2::NewState, xxh3_avx2::FreeState, xxh3_avx2::Update, xxh3_avx2::Digest};
#endif

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

// The AVX2 form where the CPU has it and it is allowed, else the library's.
static const Xxh3::Form* ChosenForm() {
#ifdef CANOPY_XXH3_AVX2
  if (Xxh3UsesAvx2()) return &kAvx2Form;
#endif
  return &kLibraryForm;
}

Xxh3::Xxh3() : form_(ChosenForm()), state_(form_->new_state()) {}

Xxh3::~Xxh3() { form_->free_state(state_); }

void Xxh3::Update(const void* p, size_t n) { form_->update(state_, p, n); }

uint64_t Xxh3::Digest() const { return form_->digest(state_); }

}  // namespace canopy::tree

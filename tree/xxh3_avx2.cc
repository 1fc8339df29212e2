// XXH3-64 compiled for AVX2 (this file alone is built with -mavx2; see
// tree/CMakeLists.txt). Only called after tree/xxh3.cc has seen AVX2 on the
// CPU. xxhash's header, inlined here (XXH_INLINE_ALL: its functions become
// static to this file, so they cannot clash with libxxhash's), picks its
// AVX2 loop from the compiler flags.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include "tree/xxh3_avx2.h"

#include <xxhash.h>

#include <cstdlib>

namespace canopy::tree::xxh3_avx2 {

void* NewState() {
  XXH3_state_t* s = XXH3_createState();
  if (s == nullptr) std::abort();
  XXH3_64bits_reset(s);
  return s;
}

void FreeState(void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }

void Update(void* state, const void* p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), p, n);
}

uint64_t Digest(const void* state) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state)); }

}  // namespace canopy::tree::xxh3_avx2

// Internal to tree/xxh3.cc: XXH3-64 built for AVX2 (tree/xxh3_avx2.cc).
// Calling any of these on a CPU without AVX2 is undefined (SIGILL).
#pragma once

#include <cstddef>
#include <cstdint>

namespace canopy::tree::xxh3_avx2 {

void* NewState();  // a reset XXH3_state_t, freed by FreeState
void FreeState(void* state);
void Update(void* state, const void* p, size_t n);
uint64_t Digest(const void* state);

}  // namespace canopy::tree::xxh3_avx2

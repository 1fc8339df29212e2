// Streaming XXH3-64, the hash behind a tree's digest (see TreeDigest in
// tree/snapshot.h): the same values as libxxhash's XXH3_64bits, from the
// fastest form this CPU runs. Where the CPU has AVX2 that is xxhash's AVX2
// code compiled into canopy (tree/xxh3_avx2.cc): on this project's AMD EPYC
// VMs it hashes 16 MB at 27-35 GB/s in 16 KiB updates and ~40 GB/s in 1 MiB
// ones, against 22-26 GB/s for the AVX-512 form libxxhash's dispatcher picks
// there (a core that splits 512-bit operations in two). Elsewhere, the
// library's dispatcher.
//
// Thread safety: one object per thread; distinct objects are independent.
// Errors: none (allocation failure aborts, as for any allocation).
#pragma once

#include <cstddef>
#include <cstdint>

namespace canopy::tree {

class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;

  // Hashes n more bytes at p (any n, any alignment).
  void Update(const void* p, size_t n);
  // The hash of every byte given so far; Update may go on after it.
  uint64_t Digest() const;

 public:
  struct Form;  // tree/xxh3.cc

 private:
  const Form* form_;  // chosen at construction
  void* state_;       // an XXH3_state_t of that form
};

// For tests: whether Xxh3 objects created from now on use the AVX2 form
// (true where the CPU has AVX2); and a way to turn it off (false) or back
// on, so that both forms can be compared on one machine.
bool Xxh3UsesAvx2();
void AllowXxh3Avx2(bool allowed);

}  // namespace canopy::tree

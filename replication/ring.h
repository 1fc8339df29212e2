// Ring: consistent-hash placement of trees on cluster nodes.
//
// Every node owns `vnodes_per_node` tokens on a 64-bit hash ring; a token is
// XXH64("<node id>#<i>"), so every process that knows the same node ids builds
// the same ring. The owners of a key (a tree name) are the first
// `replication_factor` distinct nodes met walking clockwise from XXH64(key)
// (fewer when the ring has fewer nodes). The first owner is the tree's
// default leader; the metadata service may name another one after failover.
//
// Adding a node moves only the keys whose owner set now includes it (about
// RF/N of them); removing one moves only the keys it owned.
//
// Thread safety: a Ring is a value; const methods may be called concurrently,
// mutation needs external synchronisation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/status.h"

namespace canopy::replication {

struct RingOptions {
  uint32_t vnodes_per_node = 256;
  uint32_t replication_factor = 3;
};

class Ring {
 public:
  explicit Ring(RingOptions options = {});

  // InvalidArgument for an empty id or bad options (vnodes or RF of 0);
  // AlreadyExists when the node is on the ring.
  Status AddNode(std::string_view node_id);
  // Adds every id, then places their tokens once: O(T log T) for T tokens,
  // where adding them one by one re-sorts the ring each time (tens of ms at
  // 50 nodes). Same errors as AddNode (a duplicate in `node_ids` included);
  // on error the ring is unchanged.
  Status AddNodes(const std::vector<std::string>& node_ids);
  // NotFound when it is not.
  Status RemoveNode(std::string_view node_id);
  bool Contains(std::string_view node_id) const;

  // Node ids, sorted.
  std::vector<std::string> nodes() const;
  size_t node_count() const { return node_ids_.size(); }
  const RingOptions& options() const { return options_; }

  // The first min(RF, node_count()) distinct nodes clockwise from the key's
  // hash, first = default leader. Empty when the ring is empty.
  std::vector<std::string> Owners(std::string_view key) const;

  // True when `node_id` is one of Owners(key).
  bool IsOwner(std::string_view key, std::string_view node_id) const;

  // A token range (start, end] (wrapping past 2^64-1 for the first range)
  // and the nodes that own it.
  struct Range {
    uint64_t start_exclusive = 0;
    uint64_t end_inclusive = 0;
    std::vector<std::string> owners;
  };
  // All ranges of the ring in token order; empty when the ring is empty.
  std::vector<Range> Ranges() const;

  // Fraction of the 2^64 hash space each node is an owner of (sums to
  // min(RF, N)); indexes follow nodes().
  std::vector<double> OwnershipShares() const;

  static uint64_t HashKey(std::string_view key);
  static uint64_t VnodeToken(std::string_view node_id, uint32_t index);

 private:
  struct Token {
    uint64_t value;
    uint32_t node;  // index into node_ids_
  };
  void Rebuild();
  // Owners starting from token position `pos` (index into tokens_).
  std::vector<std::string> OwnersFrom(size_t pos) const;

  RingOptions options_;
  std::vector<std::string> node_ids_;  // sorted
  std::vector<Token> tokens_;          // sorted by (value, node id)
};

}  // namespace canopy::replication

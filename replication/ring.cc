#include "replication/ring.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

namespace canopy::replication {

namespace {
constexpr uint64_t kRingSeed = 0x63616e6f70792d72ULL;  // "canopy-r"
}

Ring::Ring(RingOptions options) : options_(options) {}

uint64_t Ring::HashKey(std::string_view key) { return XXH64(key.data(), key.size(), kRingSeed); }

uint64_t Ring::VnodeToken(std::string_view node_id, uint32_t index) {
  std::string label(node_id);
  label += '#';
  label += std::to_string(index);
  return XXH64(label.data(), label.size(), kRingSeed);
}

Status Ring::AddNode(std::string_view node_id) { return AddNodes({std::string(node_id)}); }

Status Ring::AddNodes(const std::vector<std::string>& node_ids) {
  if (options_.vnodes_per_node == 0) return Status::InvalidArgument("ring: vnodes per node must be > 0");
  if (options_.replication_factor == 0) return Status::InvalidArgument("ring: replication factor must be > 0");
  std::vector<std::string> merged = node_ids_;
  for (const auto& id : node_ids) {
    if (id.empty()) return Status::InvalidArgument("ring: empty node id");
    merged.push_back(id);
  }
  std::sort(merged.begin(), merged.end());
  auto dup = std::adjacent_find(merged.begin(), merged.end());
  if (dup != merged.end()) return Status::AlreadyExists("ring: node " + *dup + " already present");
  node_ids_ = std::move(merged);
  Rebuild();
  return Status::Ok();
}

Status Ring::RemoveNode(std::string_view node_id) {
  auto it = std::lower_bound(node_ids_.begin(), node_ids_.end(), node_id);
  if (it == node_ids_.end() || *it != node_id) {
    return Status::NotFound("ring: node " + std::string(node_id) + " not present");
  }
  node_ids_.erase(it);
  Rebuild();
  return Status::Ok();
}

bool Ring::Contains(std::string_view node_id) const {
  return std::binary_search(node_ids_.begin(), node_ids_.end(), node_id);
}

std::vector<std::string> Ring::nodes() const { return node_ids_; }

void Ring::Rebuild() {
  tokens_.clear();
  tokens_.reserve(node_ids_.size() * options_.vnodes_per_node);
  for (uint32_t n = 0; n < node_ids_.size(); ++n) {
    for (uint32_t i = 0; i < options_.vnodes_per_node; ++i) {
      tokens_.push_back(Token{VnodeToken(node_ids_[n], i), n});
    }
  }
  // node_ids_ is sorted, so comparing node indexes orders ties by node id:
  // the order does not depend on insertion history.
  std::sort(tokens_.begin(), tokens_.end(), [](const Token& a, const Token& b) {
    return a.value != b.value ? a.value < b.value : a.node < b.node;
  });
}

std::vector<std::string> Ring::OwnersFrom(size_t pos) const {
  std::vector<std::string> owners;
  const size_t want = std::min<size_t>(options_.replication_factor, node_ids_.size());
  std::vector<bool> taken(node_ids_.size(), false);
  for (size_t step = 0; step < tokens_.size() && owners.size() < want; ++step) {
    const Token& t = tokens_[(pos + step) % tokens_.size()];
    if (!taken[t.node]) {
      taken[t.node] = true;
      owners.push_back(node_ids_[t.node]);
    }
  }
  return owners;
}

std::vector<std::string> Ring::Owners(std::string_view key) const {
  if (tokens_.empty()) return {};
  const uint64_t h = HashKey(key);
  auto it = std::lower_bound(tokens_.begin(), tokens_.end(), h,
                             [](const Token& t, uint64_t v) { return t.value < v; });
  size_t pos = it == tokens_.end() ? 0 : static_cast<size_t>(it - tokens_.begin());
  return OwnersFrom(pos);
}

bool Ring::IsOwner(std::string_view key, std::string_view node_id) const {
  for (const auto& o : Owners(key)) {
    if (o == node_id) return true;
  }
  return false;
}

std::vector<Ring::Range> Ring::Ranges() const {
  std::vector<Range> ranges;
  ranges.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    Range r;
    r.start_exclusive = tokens_[(i + tokens_.size() - 1) % tokens_.size()].value;
    r.end_inclusive = tokens_[i].value;
    r.owners = OwnersFrom(i);
    ranges.push_back(std::move(r));
  }
  return ranges;
}

std::vector<double> Ring::OwnershipShares() const {
  std::vector<double> shares(node_ids_.size(), 0.0);
  if (tokens_.empty()) return shares;
  constexpr double kSpace = 18446744073709551616.0;  // 2^64
  for (const Range& r : Ranges()) {
    // Unsigned wrap-around gives the width of (start, end] for every range;
    // a single token covers the whole ring.
    uint64_t width = r.end_inclusive - r.start_exclusive;
    double frac = tokens_.size() == 1 ? 1.0 : static_cast<double>(width) / kSpace;
    for (const auto& o : r.owners) {
      auto idx = std::lower_bound(node_ids_.begin(), node_ids_.end(), o) - node_ids_.begin();
      shares[idx] += frac;
    }
  }
  return shares;
}

}  // namespace canopy::replication

// Credit accounting for the RDMA backend (no verbs here).
//
// A sender may only SEND into a receive slot the peer has posted. The peer
// offers `depth` slots of each class (data, control) in its hello and then
// reports, as cumulative 32-bit counters, how many slots it has re-posted
// (piggybacked in every item header and RDMA-written into the sender's credit
// block). SendCredits turns those reports into "may I send now?".
// CreditReturner is the receiving side: it counts re-posted slots and says
// when a report is due so that a blocked sender is never left waiting.
//
// Thread safety: none; the connection guards each object with its mutex.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace canopy::transport::rdma {

class SendCredits {
 public:
  SendCredits() = default;
  // Before the peer's hello: `depth` slots are assumed (1 control slot is
  // always there for the hello itself).
  explicit SendCredits(uint32_t depth) : depth_(depth) {}

  // Sets the depth the peer offers (from its hello). Items sent before count.
  void SetDepth(uint32_t depth) { depth_ = depth; }
  uint32_t depth() const { return depth_; }

  // Credits left: depth - (sent - peer_reposted).
  uint32_t available() const;
  bool CanSend() const { return available() > 0; }
  // REQUIRES: CanSend().
  void Consume();

  // A cumulative re-post count from the peer. Older (stale) reports are
  // ignored; a report claiming more re-posts than items sent is Corruption.
  Status OnPeerReport(uint32_t peer_reposted);

  uint32_t sent() const { return sent_; }
  uint32_t peer_reposted() const { return peer_reposted_; }

 private:
  uint32_t depth_ = 0;
  uint32_t sent_ = 0;
  uint32_t peer_reposted_ = 0;
};

class CreditReturner {
 public:
  // Report once `threshold` re-posts have not been reported (>= 1).
  explicit CreditReturner(uint32_t threshold = 1) : threshold_(threshold == 0 ? 1 : threshold) {}

  void OnReposted(uint32_t count = 1) { reposted_ += count; }
  // The cumulative count to put in an outgoing item header; marks it reported.
  uint32_t TakeForPiggyback() {
    reported_ = reposted_;
    return reposted_;
  }
  // True when enough re-posts are unreported that an explicit credit write is due.
  bool ReportDue() const { return static_cast<uint32_t>(reposted_ - reported_) >= threshold_; }
  uint32_t unreported() const { return reposted_ - reported_; }
  uint32_t reposted() const { return reposted_; }

 private:
  uint32_t threshold_;
  uint32_t reposted_ = 0;
  uint32_t reported_ = 0;
};

}  // namespace canopy::transport::rdma

// FailureDetector (replication/failure_detector.h) on explicit time points.
#include "replication/failure_detector.h"

#include <gtest/gtest.h>

#include <cmath>

namespace canopy::replication {
namespace {

using std::chrono::milliseconds;

FailureDetectorOptions Options() {
  FailureDetectorOptions o;
  o.expected_interval = milliseconds(100);
  o.min_stddev = milliseconds(25);
  o.acceptable_pause = milliseconds(50);
  o.phi_threshold = 8;
  return o;
}

TEST(FailureDetectorTest, NeverHeardIsSuspected) {
  FailureDetector d(Options());
  auto t = Clock::now();
  EXPECT_TRUE(d.Suspected("a", t));
  EXPECT_TRUE(std::isinf(d.Phi("a", t)));
  EXPECT_FALSE(d.LastHeard("a"));
}

TEST(FailureDetectorTest, PhiWaitsForEnoughSamples) {
  FailureDetector d(Options());
  auto t = Clock::now();
  d.Heard("a", t);
  d.Heard("a", t + milliseconds(2000));  // one gap: a rhythm not known yet
  EXPECT_FALSE(d.Suspected("a", t + milliseconds(60000)));
  EXPECT_EQ(d.Phi("a", t + milliseconds(60000)), 0);
  d.Heard("a", t + milliseconds(4000));
  d.Heard("a", t + milliseconds(6000));
  EXPECT_FALSE(d.Suspected("a", t + milliseconds(8000)));
  EXPECT_TRUE(d.Suspected("a", t + milliseconds(60000)));
}

TEST(FailureDetectorTest, PhiGrowsWithSilenceAndRegularHeartbeatsKeepItLow) {
  FailureDetector d(Options());
  auto t = Clock::now();
  for (int i = 0; i < 20; ++i) d.Heard("a", t + milliseconds(100 * i));
  auto last = t + milliseconds(1900);
  EXPECT_FALSE(d.Suspected("a", last + milliseconds(100)));
  EXPECT_LT(d.Phi("a", last + milliseconds(100)), 1.0);
  double p200 = d.Phi("a", last + milliseconds(200));
  double p300 = d.Phi("a", last + milliseconds(300));
  EXPECT_LT(p200, p300);
  // Mean 100 + pause 50, stddev 25 (the floor): phi 8 about 5.6 stddevs on.
  EXPECT_FALSE(d.Suspected("a", last + milliseconds(250)));
  EXPECT_TRUE(d.Suspected("a", last + milliseconds(400)));
  // A heartbeat clears it.
  d.Heard("a", last + milliseconds(400));
  EXPECT_FALSE(d.Suspected("a", last + milliseconds(450)));
}

TEST(FailureDetectorTest, JitteryPeersGetMoreSlack) {
  FailureDetector steady(Options()), jittery(Options());
  auto t = Clock::now();
  auto ts = t, tj = t;
  for (int i = 0; i < 40; ++i) {
    steady.Heard("a", ts);
    jittery.Heard("a", tj);
    ts += milliseconds(100);
    tj += milliseconds(i % 2 ? 50 : 350);
  }
  ts -= milliseconds(100);
  tj -= milliseconds(50);
  // The same silence is far less suspicious from a peer known to pause.
  EXPECT_GT(steady.Phi("a", ts + milliseconds(500)), jittery.Phi("a", tj + milliseconds(500)) + 3);
}

TEST(FailureDetectorTest, BurstsDoNotShrinkTheExpectedGap) {
  FailureDetector d(Options());
  auto t = Clock::now();
  // Idle heartbeats, then a burst of 1000 messages 1 ms apart.
  for (int i = 0; i < 10; ++i) d.Heard("a", t + milliseconds(100 * i));
  auto burst = t + milliseconds(1000);
  for (int i = 0; i < 1000; ++i) d.Heard("a", burst + milliseconds(i));
  auto last = burst + milliseconds(999);
  // Back to idle: one heartbeat interval of silence is not suspicious.
  EXPECT_FALSE(d.Suspected("a", last + milliseconds(150)));
}

TEST(FailureDetectorTest, LossEvidenceSuspectsAtOnceUntilHeardAgain) {
  FailureDetector d(Options());
  auto t = Clock::now();
  for (int i = 0; i < 10; ++i) d.Heard("a", t + milliseconds(100 * i));
  auto now = t + milliseconds(920);
  EXPECT_FALSE(d.Suspected("a", now));
  d.Lost("a", now);
  EXPECT_TRUE(d.HasLossEvidence("a"));
  EXPECT_TRUE(d.Suspected("a", now));
  d.Heard("a", now + milliseconds(5));
  EXPECT_FALSE(d.HasLossEvidence("a"));
  EXPECT_FALSE(d.Suspected("a", now + milliseconds(10)));
  // Other peers are unaffected.
  d.Heard("b", now);
  d.Lost("a", now + milliseconds(20));
  EXPECT_FALSE(d.Suspected("b", now + milliseconds(20)));
  d.Forget("a");
  EXPECT_FALSE(d.LastHeard("a"));
}

}  // namespace
}  // namespace canopy::replication

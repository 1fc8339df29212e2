// The transport conformance suite: one set of behavioural tests that every
// backend (tcp, dpdk, rdma) must pass, written against transport.h only.
//
// A backend's test file instantiates it with one or more ConformanceBackend
// values:
//
//   #include "tests/transport_conformance.h"
//   using canopy::transport::testing::ConformanceBackend;
//   using canopy::transport::testing::TransportConformanceTest;  // the macro needs it unqualified
//   INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformanceTest,
//                            ::testing::Values(ConformanceBackend{.name = "ipv4",
//                                                                 .listen_uri = "tcp://127.0.0.1:0"}),
//                            canopy::transport::testing::ConformanceBackendName);
//
// and links the object library canopy_conformance (tests/CMakeLists.txt).
//
// Per test, SetUp() calls RegisterBuiltinTransports(), creates two Transport
// instances of the URI's scheme from the global registry — one with
// listener_options, one with dialer_options (a backend may need distinct
// options per side, e.g. two DPDK ports in one process) — and listens on
// listen_uri. Connections are made with the dialer transport to the
// listener's local_endpoint(); Accept runs on its own thread while Connect
// runs, so backends whose connect needs an accepting peer (RDMA CM) work.
//
// Requirements on the options: max_message_bytes >= 64 MiB on both sides
// (the suite sends 64 MiB payloads), and the dialer's max_message_bytes at
// most 256 MiB (the oversized-message case allocates max_message_bytes + 1
// bytes). connect_timeout should be a few seconds at most.
//
// Every wait in the suite is bounded; a backend that hangs fails with a
// timeout message instead of blocking ctest.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <utility>

#include "base/result.h"
#include "transport/transport.h"

namespace canopy::transport::testing {

struct ConformanceBackend {
  // Suffix of the test names; letters, digits and '_' only (gtest rule).
  std::string name;
  // Where the listener binds; port 0 so that tests can run in parallel.
  std::string listen_uri;
  TransportOptions listener_options;
  TransportOptions dialer_options;
  // Returns why this backend cannot run here (no device, no permission);
  // empty means run. Called in SetUp; the test is skipped with the reason.
  std::function<std::string()> skip_reason;
};

// gtest prints a parameter in every test's listing; print the name instead of
// the struct's raw bytes.
void PrintTo(const ConformanceBackend& backend, std::ostream* os);

// Name generator for INSTANTIATE_TEST_SUITE_P: the backend's name.
std::string ConformanceBackendName(const ::testing::TestParamInfo<ConformanceBackend>& info);

class TransportConformanceTest : public ::testing::TestWithParam<ConformanceBackend> {
 protected:
  struct ConnectionPair {
    std::unique_ptr<Connection> client;  // made by the dialer transport
    std::unique_ptr<Connection> server;  // accepted by the listener
  };

  void SetUp() override;
  void TearDown() override;

  // Connects a new client to listener_ and accepts it (Accept on a helper
  // thread, bounded by a 20 s deadline). The error of whichever side failed.
  Result<ConnectionPair> ConnectPair();

  std::shared_ptr<Transport> listener_transport_;
  std::shared_ptr<Transport> dialer_transport_;
  std::unique_ptr<Listener> listener_;
  Endpoint listen_endpoint_;  // listener_->local_endpoint(), real port
};

}  // namespace canopy::transport::testing

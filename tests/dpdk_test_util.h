// Helpers for the dpdk:// tests: a pair of net_memif ports in one process
// (port 0 serves, port 1 dials, joined through one socket) and a connected
// client/server pair over them.
#pragma once

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/builtin.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace canopy::transport {

using namespace std::chrono_literals;

// EAL arguments shared by every transport of this process: two memif ports
// joined through one socket (port 0 serves, port 1 dials).
inline std::vector<std::string> MemifPairArgs() {
  std::string socket = "/tmp/canopy-dpdk-test-" + std::to_string(getpid()) + ".sock";
  return {"--no-huge",
          "-m",
          "512",
          "--no-pci",
          "--log-level=lib.eal:warning",
          "--vdev=net_memif0,role=server,bsize=16384,socket=" + socket,
          "--vdev=net_memif1,role=client,bsize=16384,socket=" + socket};
}

inline TransportOptions MemifOptions(const std::string& canopy_args) {
  TransportOptions options;
  options.backend_args = MemifPairArgs();
  options.backend_args.push_back(canopy_args);
  // Hang bounds, not what a test asserts: generous, since a loaded machine
  // delays the EAL's polling threads (a connect's ARP took over 5 s at load 40).
  options.connect_timeout = 15s;
  options.io_timeout = 10s;
  return options;
}

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client;
  std::unique_ptr<Connection> server;
};

inline Result<Pair> ConnectMemifPair(const std::string& extra) {
  RegisterBuiltinTransports();
  CANOPY_ASSIGN_OR_RETURN(auto server_t,
                          TransportRegistry::Global().Create("dpdk", MemifOptions("port=0," + extra)));
  CANOPY_ASSIGN_OR_RETURN(auto client_t,
                          TransportRegistry::Global().Create("dpdk", MemifOptions("port=1," + extra)));
  CANOPY_ASSIGN_OR_RETURN(auto endpoint, ParseEndpoint("dpdk://10.0.0.1:0"));
  Pair pair;
  CANOPY_ASSIGN_OR_RETURN(pair.listener, server_t->Listen(endpoint));
  std::unique_ptr<Connection> client;
  Status connect_status;
  std::thread dialer([&] {
    auto c = client_t->Connect(pair.listener->local_endpoint());
    if (c.ok())
      client = std::move(*c);
    else
      connect_status = c.status();
  });
  auto accepted = pair.listener->Accept(Deadline::After(20s));
  dialer.join();
  CANOPY_RETURN_IF_ERROR(connect_status);
  if (!accepted.ok()) return accepted.status();
  pair.client = std::move(client);
  pair.server = std::move(*accepted);
  return pair;
}

}  // namespace canopy::transport

// chaosproxy: fault-injecting TCP forwarder for canopy's reliability tests.
//
//   chaosproxy --target 127.0.0.1:7001 [--listen 127.0.0.1:0] [--delay-ms N]
//              [--corrupt-prob P] [--cut-after-bytes N] [--seed S]
//
// Prints "listening on 127.0.0.1:PORT" once ready. Signals: SIGUSR1 cuts every
// open connection, SIGUSR2 toggles a partition (black hole), SIGTERM/SIGINT
// stop it and print the fault counters as one JSON line.
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include <boost/program_options.hpp>

#include "tools/chaosproxy/chaos_proxy.h"

namespace po = boost::program_options;

namespace {

bool SplitHostPort(const std::string& text, std::string* host, uint16_t* port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  *host = text.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  try {
    unsigned long p = std::stoul(text.substr(colon + 1));
    if (p > 65535) return false;
    *port = static_cast<uint16_t>(p);
  } catch (...) {
    return false;
  }
  return !host->empty();
}

}  // namespace

int main(int argc, char** argv) {
  using canopy::chaos::ChaosOptions;
  using canopy::chaos::ChaosProxy;
  ChaosOptions opt;
  std::string listen = "127.0.0.1:0", target;
  po::options_description desc("chaosproxy: a fault-injecting TCP forwarder between loopback addresses\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("listen", po::value(&listen)->default_value(listen), "HOST:PORT to accept on (port 0: ephemeral)")
      ("target", po::value(&target)->required(), "HOST:PORT to forward to")
      ("delay-ms", po::value(&opt.delay_ms)->default_value(0), "hold every chunk this long before forwarding")
      ("corrupt-prob", po::value(&opt.corrupt_prob)->default_value(0.0),
       "probability that a forwarded chunk gets one byte flipped")
      ("cut-after-bytes", po::value(&opt.cut_after_bytes)->default_value(0),
       "reset a connection after this many bytes (0: never)")
      ("seed", po::value(&opt.seed)->default_value(1), "random seed for the faults");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\nsignals: SIGUSR1 cut all connections, SIGUSR2 toggle partition, SIGTERM stop\n";
      return 0;
    }
    po::notify(vm);
    if (!SplitHostPort(listen, &opt.listen_host, &opt.listen_port)) throw po::error("bad --listen " + listen);
    if (!SplitHostPort(target, &opt.target_host, &opt.target_port)) throw po::error("bad --target " + target);
  } catch (const po::error& e) {
    std::cerr << "chaosproxy: " << e.what() << "\n" << desc;
    return 2;
  }

  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // handled by the signal thread only

  auto proxy = ChaosProxy::Create(opt);
  if (!proxy.ok()) {
    std::cerr << "chaosproxy: " << proxy.status().ToString() << "\n";
    return 1;
  }
  ChaosProxy& p = **proxy;
  std::printf("listening on %s:%u\n", opt.listen_host.c_str(), p.port());
  std::fflush(stdout);

  std::thread signals([&] {
    bool partitioned = false;
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (sig == SIGUSR1) {
        p.CutAll();
      } else if (sig == SIGUSR2) {
        partitioned = !partitioned;
        p.SetPartitioned(partitioned);
      } else {
        p.Stop();
        return;
      }
    }
  });
  canopy::Status s = p.Run();
  if (!s.ok()) {
    std::cerr << "chaosproxy: " << s.ToString() << "\n";
    std::_Exit(1);
  }
  signals.join();
  const auto& c = p.counters();
  std::printf("{\"connections\":%lu,\"bytes_forwarded\":%lu,\"corruptions\":%lu,\"cuts\":%lu,\"discarded_bytes\":%lu}\n",
              (unsigned long)c.connections.load(), (unsigned long)c.bytes_forwarded.load(),
              (unsigned long)c.corruptions.load(), (unsigned long)c.cuts.load(),
              (unsigned long)c.discarded_bytes.load());
  return 0;
}

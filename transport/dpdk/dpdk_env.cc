#include "transport/dpdk/dpdk_env.h"

#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <sched.h>
#include <unistd.h>

#include <charconv>
#include <fstream>

#include "base/logging.h"

namespace canopy::transport::dpdk {
namespace {

std::mutex g_mu;
DpdkEnv* g_env = nullptr;
Status* g_failed = nullptr;
// The EAL keeps pointers into its argv: kept for the process lifetime.
std::vector<std::string>* g_argv_storage = nullptr;
std::vector<char*>* g_argv = nullptr;

bool StartsWith(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

bool HasOption(const std::vector<std::string>& args, std::initializer_list<std::string_view> names) {
  for (const std::string& a : args) {
    for (std::string_view n : names) {
      if (a == n || (StartsWith(a, n) && a.size() > n.size() && a[n.size()] == '=')) return true;
    }
  }
  return false;
}

bool FreeHugepages() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value > 0;
    std::string rest;
    std::getline(in, rest);
  }
  return false;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

// Splits --vdev values from the rest; refuses what would end the process.
Status SortArgs(const std::vector<std::string>& args, std::vector<std::string>* rest,
                std::vector<std::string>* vdevs) {
  static const std::set<std::string, std::less<>> kExiting = {"-h", "--help", "--usage"};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.empty()) return Status::InvalidArgument("empty EAL argument");
    if (kExiting.count(a) != 0) {
      return Status::InvalidArgument("EAL argument '" + a +
                                     "' is not allowed (the EAL would print usage and exit)");
    }
    if (a == "--vdev") {
      if (i + 1 >= args.size())
        return Status::InvalidArgument("EAL argument --vdev needs a device (e.g. net_memif0)");
      vdevs->push_back(args[++i]);
    } else if (StartsWith(a, "--vdev=")) {
      if (a.size() == 7)
        return Status::InvalidArgument("EAL argument --vdev= needs a device (e.g. net_memif0)");
      vdevs->push_back(a.substr(7));
    } else {
      if ((a == "-m" || a == "-n") && i + 1 < args.size()) {
        const std::string& v = args[i + 1];
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
          return Status::InvalidArgument("EAL argument " + a + " needs a number, got '" + v + "'");
        }
      }
      rest->push_back(a);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DpdkEnv*> DpdkEnv::Acquire(const std::vector<std::string>& eal_args) {
  std::vector<std::string> rest, vdevs;
  CANOPY_RETURN_IF_ERROR(SortArgs(eal_args, &rest, &vdevs));
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_env != nullptr) {
    if (rest != g_env->base_args_) {
      return Status::InvalidArgument("the DPDK EAL is already initialised in this process with '" +
                                     Join(g_env->base_args_) + "'; another transport asked for '" +
                                     Join(rest) + "' (only extra --vdev devices may differ)");
    }
    for (const std::string& v : vdevs) {
      if (g_env->vdevs_.count(v) != 0) continue;
      int rc = rte_dev_probe(v.c_str());
      if (rc < 0) {
        return Status::InvalidArgument("hot-plugging DPDK device '" + v + "' failed: " + rte_strerror(-rc));
      }
      g_env->vdevs_.insert(v);
    }
    return g_env;
  }
  if (g_failed != nullptr) return *g_failed;

  std::vector<std::string> argv = {"canopy"};
  argv.insert(argv.end(), rest.begin(), rest.end());
  for (const std::string& v : vdevs) argv.push_back("--vdev=" + v);
  if (!HasOption(rest, {"--file-prefix"})) argv.push_back("--file-prefix=canopy-" + std::to_string(getpid()));
  bool no_huge = HasOption(rest, {"--no-huge", "--in-memory"});
  if (!no_huge && !FreeHugepages()) {
    argv.push_back("--no-huge");
    no_huge = true;
  }
  if (no_huge && !HasOption(rest, {"-m", "--socket-mem"})) {
    argv.push_back("-m");
    argv.push_back("256");
  }
  g_argv_storage = new std::vector<std::string>(argv);
  g_argv = new std::vector<char*>();
  for (std::string& s : *g_argv_storage) g_argv->push_back(s.data());
  g_argv->push_back(nullptr);
  std::vector<char*>* cargv = g_argv;

  // rte_eal_init pins the calling thread to the main lcore; undo that so the
  // application's threads (and the I/O threads they start) are not confined.
  cpu_set_t saved;
  bool have_affinity = sched_getaffinity(0, sizeof(saved), &saved) == 0;
  int rc = rte_eal_init(static_cast<int>(cargv->size() - 1), cargv->data());
  int err = rte_errno;
  if (have_affinity) (void)sched_setaffinity(0, sizeof(saved), &saved);
  if (rc < 0) {
    Status s = Status::InvalidArgument("DPDK EAL initialisation failed (" + std::string(rte_strerror(err)) +
                                       ") with arguments '" + Join(argv) + "'; see the EAL messages above");
    if (err != EINVAL) g_failed = new Status(s);  // the EAL allows a retry only after a parse error
    return s;
  }
  auto* env = new DpdkEnv();
  env->argv_ = argv;
  env->base_args_ = rest;
  env->vdevs_ = std::set<std::string>(vdevs.begin(), vdevs.end());
  g_env = env;
  CANOPY_LOG(kInfo, "dpdk: EAL up ({}), {} port(s)", Join(argv), rte_eth_dev_count_avail());
  return g_env;
}

Result<std::shared_ptr<DpdkPort>> DpdkEnv::Port(const std::string& name, const PortSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  uint16_t id = 0;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), id);
  if (ec != std::errc() || ptr != name.data() + name.size()) {
    if (rte_eth_dev_get_port_by_name(name.c_str(), &id) != 0) {
      return Status::NotFound("no DPDK port named '" + name + "' (" +
                              std::to_string(rte_eth_dev_count_avail()) +
                              " port(s); pass --vdev=... or bind a NIC, see hw/DPDK.md)");
    }
  }
  auto it = ports_.find(id);
  if (it != ports_.end()) return it->second;
  if (!rte_eth_dev_is_valid_port(id)) {
    return Status::NotFound("no DPDK port " + name + " (" + std::to_string(rte_eth_dev_count_avail()) +
                            " port(s); pass --vdev=... or bind a NIC, see hw/DPDK.md)");
  }
  CANOPY_ASSIGN_OR_RETURN(auto port, DpdkPort::Start(id, settings));
  ports_[id] = port;
  return port;
}

}  // namespace canopy::transport::dpdk

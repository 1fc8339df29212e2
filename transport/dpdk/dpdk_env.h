// DpdkEnv: the process-wide DPDK state — the EAL (which can be initialised
// only once per process) and the ports started so far — kept in one place.
//
// The first Acquire() initialises the EAL from the given arguments plus
// defaults for test runs: --file-prefix=canopy-<pid> when no prefix is
// given, and --no-huge -m 256 when the host has no free hugepages and no
// memory option was given. Arguments that would make the EAL exit the
// process (--help) are refused. Later calls (a second Transport) must pass
// the same EAL arguments, except that --vdev devices not yet present are
// hot-plugged; anything else is InvalidArgument. A failed initialisation is
// remembered and returned again (the EAL cannot be retried), except for
// argument parse errors, which the EAL lets a later call correct.
//
// Thread safety: all methods are safe to call concurrently. Nothing is ever
// torn down: ports and their I/O threads live until the process exits.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "transport/dpdk/dpdk_port.h"

namespace canopy::transport::dpdk {

class DpdkEnv {
 public:
  // InvalidArgument for refused or conflicting arguments, or the EAL's error
  // (with its rte_errno text) when rte_eal_init fails.
  static Result<DpdkEnv*> Acquire(const std::vector<std::string>& eal_args);

  // The port named by id ("0") or device name ("net_memif0"), configured
  // and started on first use with `settings` (later uses share it).
  Result<std::shared_ptr<DpdkPort>> Port(const std::string& name, const PortSettings& settings);

  // The argument list rte_eal_init got (for messages and tests).
  const std::vector<std::string>& eal_argv() const { return argv_; }

 private:
  DpdkEnv() = default;
  std::mutex mu_;
  std::vector<std::string> argv_;
  std::vector<std::string> base_args_;  // user arguments other than --vdev
  std::set<std::string> vdevs_;
  std::map<uint16_t, std::shared_ptr<DpdkPort>> ports_;
};

}  // namespace canopy::transport::dpdk

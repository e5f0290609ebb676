// Stand-in for verbs_ibv.cc in builds without libibverbs: no real ports (the emulation works).
#include "transport/ib/verbs.h"

namespace chorus::transport::ib {

Result<std::vector<Port>> ibv_list_ports() {
  return std::vector<Port>{};
}

Result<std::shared_ptr<Nic>> ibv_open_nic(const Port& port, int) {
  return make_error(Code::kInvalidUsage, "ib: {}: this build has no libibverbs (rdma-core)",
                    port.name());
}

}  // namespace chorus::transport::ib

// Grouped point-to-point operations (see group.cc).
#pragma once

#include <vector>

#include "collectives/comm.h"

namespace chorus {

struct GroupItem {
  OpDesc desc;  // kind kSend or kRecv, with its per-pair sequence number
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
};

Status run_group(OpCtx& ctx, const std::vector<GroupItem>& items, uint64_t uid);

}  // namespace chorus

// Fuzz target: what the ib backend reads from outside -- a peer's queue pair record from the
// bootstrap store (link.h, QpRecord), CHORUS_IB_HCA (hca.h) and CHORUS_IB_EMULATE (verbs.h).
// The first byte picks the parser; records that parse must survive a round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/ib/hca.h"
#include "transport/ib/link.h"

using namespace chorus::transport::ib;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto r = QpRecord::decode(text, 1);
      if (r.is_ok()) {
        auto again = QpRecord::decode(r->encode(), 1);
        if (!again.is_ok() || again->qp.qpn != r->qp.qpn || again->qp.gid != r->qp.gid ||
            again->slots.addr != r->slots.addr || again->slots.rkey != r->slots.rkey ||
            again->slot_bytes != r->slot_bytes || again->nslots != r->nslots)
          __builtin_trap();
      }
      break;
    }
    case 1: {
      auto f = parse_hca(text);
      if (f.is_ok()) {
        for (auto& e : f->entries)
          if (e.name.empty() || e.port == 0 || e.port > 255) __builtin_trap();
        (void)f->allows("mlx5_0", 1);
      }
      break;
    }
    default: {
      auto p = emu_list_ports(text);
      if (p.is_ok())
        for (auto& port : *p)
          if (port.device.empty() || port.port < 1 || port.port > 9) __builtin_trap();
      break;
    }
  }
  return 0;
}

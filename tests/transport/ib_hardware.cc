// [ib] on a real HCA: opens the first active port, connects a queue pair to itself, and moves
// a message through the ib link's protocol. Exits 77 (skipped) with the reason where no port
// is active -- every machine of this project so far.
#include <cstdio>
#include <cstring>
#include <vector>

#include "transport/ib/link.h"
#include "transport/ib/verbs.h"

using namespace chorus::transport::ib;

int main() {
  auto ports = ibv_list_ports();
  if (!ports.is_ok()) {
    std::printf("skipped: %s\n", ports.status().message().c_str());
    return 77;
  }
  const Port* port = nullptr;
  for (auto& p : *ports)
    if (p.active && !port) port = &p;
  if (!port) {
    std::printf("skipped: ibv_get_device_list found %zu port(s), none active (no HCA here)\n",
                ports->size());
    return 77;
  }
  auto nic = ibv_open_nic(*port, 0);
  if (!nic.is_ok()) return std::printf("FAIL: %s\n", nic.status().message().c_str()), 1;
  LinkConfig cfg{65536, 4, 0, 1 << 20};
  QpAddr qa, qb;
  SlotsAddr sa, sb;
  auto a = IbLink::create(1, "self b", *nic, nic->get(), cfg, &qa, &sa);
  auto b = IbLink::create(0, "self a", *nic, nic->get(), cfg, &qb, &sb);
  if (!a.is_ok() || !b.is_ok()) return std::printf("FAIL: link creation\n"), 1;
  if (!(*nic)->connect_qp((*a)->qp(), qb).is_ok() || !(*nic)->connect_qp((*b)->qp(), qa).is_ok())
    return std::printf("FAIL: connect\n"), 1;
  (*a)->set_remote(sb);
  (*b)->set_remote(sa);
  std::vector<char> out(1 << 20), in(1 << 20);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7);
  uint64_t s = (*a)->post_send(out.data(), out.size());
  uint64_t r = (*b)->post_recv(in.data(), in.size());
  for (long i = 0; i < 100000000 && !((*a)->send_done(s) && (*b)->recv_done(r)); ++i) {
    auto x = (*a)->progress();
    auto y = (*b)->progress();
    if (!x.is_ok()) return std::printf("FAIL: %s\n", x.status().message().c_str()), 1;
    if (!y.is_ok()) return std::printf("FAIL: %s\n", y.status().message().c_str()), 1;
  }
  if (in != out) return std::printf("FAIL: bytes differ on %s\n", port->name().c_str()), 1;
  std::printf("ok: 1 MiB through %s\n", port->name().c_str());
  return 0;
}

// Grouped send/recv (chorusGroupStart/End): every send and receive of a group is posted at
// once, so exchanges such as "everyone sends to the right and receives from the left" cannot
// deadlock whatever the message sizes. Each message still carries its own header, checked
// against the matching call; messages between one pair keep their call order.
#include "collectives/group.h"

#include <map>

namespace chorus {

Status run_group(OpCtx& ctx, const std::vector<GroupItem>& items, uint64_t uid) {
  struct RecvState {
    const GroupItem* item;
    OpHeader header;
    uint64_t header_ticket = 0, data_ticket = 0;
    bool header_posted = false, data_posted = false;
  };
  std::vector<OpHeader> send_headers(items.size());
  std::map<int, std::vector<RecvState>> recvs;  // per peer, in call order
  std::vector<std::pair<int, uint64_t>> sends;
  for (size_t i = 0; i < items.size(); ++i) {
    const GroupItem& it = items[i];
    if (it.desc.kind == OpKind::kSend) {
      send_headers[i] = make_header(it.desc, ctx.rank(), uid);
      ctx.link(it.desc.peer).post_send(&send_headers[i], sizeof(OpHeader));
      sends.push_back({it.desc.peer, ctx.link(it.desc.peer).post_send(it.send, it.bytes)});
    } else {
      recvs[it.desc.peer].push_back({&it, {}});
    }
  }
  // Per peer: post the next header only once the previous message's data is posted, so the
  // stream lands in the right buffers.
  Status failure;
  auto advance = [&]() {
    bool all = true;
    for (auto& [peer, list] : recvs) {
      for (auto& r : list) {
        if (!r.header_posted) {
          r.header_ticket = ctx.link(peer).post_recv(&r.header, sizeof(OpHeader));
          r.header_posted = true;
        }
        if (!r.data_posted) {
          if (!ctx.link(peer).recv_done(r.header_ticket)) {
            all = false;
            break;
          }
          Status s = check_header(r.header, peer, r.item->desc, ctx.rank(), uid);
          if (!s.is_ok()) {
            failure = s;
            return true;
          }
          r.data_ticket = ctx.link(peer).post_recv(r.item->recv, r.item->bytes);
          r.data_posted = true;
        }
        if (!ctx.link(peer).recv_done(r.data_ticket)) all = false;
      }
    }
    for (auto& [peer, t] : sends)
      if (!ctx.link(peer).send_done(t)) all = false;
    return all;
  };
  CHORUS_TRY(ctx.wait(advance, -1));
  return failure;
}

}  // namespace chorus

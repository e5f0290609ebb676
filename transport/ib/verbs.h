// The verbs the ib backend uses, behind one narrow interface (Nic), with two implementations:
//   verbs_ibv.cc  libibverbs (rdma-core) on a real HCA -- never run on the project's machines,
//                 which have none (the closing notes say which lines have run where);
//   verbs_emu.cc  an emulation between processes of one host in shared memory: RDMA writes
//                 into peers' staging memory, write-with-immediate completions, receive queues,
//                 and the errors real hardware reports (protection, access, receiver not ready,
//                 retry exceeded, flushed). Everything above this file is tested against it.
//
// Only what the link protocol needs: reliable-connected queue pairs, one completion queue per
// queue pair, RDMA write with immediate, receives (which only carry immediates), memory
// registration, and one wake-up source per Nic.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/link.h"

namespace chorus::transport::ib {

// One port of one device, as listed: "mlx5_0", port 1.
struct Port {
  std::string device;
  int port = 1;
  bool active = false;
  bool ethernet = false;  // RoCE: addressed by GID, not by LID
  std::string name() const { return device + ":" + std::to_string(port); }
};

// A queue pair's address, published through the bootstrap store.
struct QpAddr {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid{};
  std::string encode() const;
  static Result<QpAddr> decode(const std::string& s);
};

// A registered range. lkey lets this side's HCA read it; rkey lets a peer write it.
struct Mr {
  char* base = nullptr;
  size_t bytes = 0;
  uint32_t lkey = 0, rkey = 0;
  void* handle = nullptr;  // the implementation's
  bool covers(const void* p, size_t n) const {
    const char* c = static_cast<const char*>(p);
    return c >= base && n <= bytes && static_cast<size_t>(c - base) <= bytes - n;
  }
};

// Work completion status: the numbering of ibv_wc_status, so both implementations report the
// same words.
enum WcStatus : int {
  kWcSuccess = 0,
  kWcLocLenErr = 1,
  kWcLocProtErr = 4,
  kWcWrFlushErr = 5,
  kWcRemAccessErr = 10,
  kWcRetryExcErr = 12,
  kWcRnrRetryExcErr = 13,
  kWcGeneralErr = 21,
};
const char* wc_status_name(int status);

struct Wc {
  uint64_t wr_id = 0;
  bool recv = false;  // a receive consumed by a peer's write with immediate
  int status = kWcSuccess;
  uint32_t imm = 0;
  uint32_t bytes = 0;  // receives: the bytes the write carried
};

// One opened port: its protection domain, queue pairs and their completion queues. Also the
// wake-up source of every link on it (real: the completion channel's descriptor; emulated: a
// doorbell in shared memory that peers ring after each write).
class Nic : public WakeSource {
 public:
  virtual const std::string& name() const = 0;  // "mlx5_0:1"
  // Registrations follow the process's mapping (on-demand paging): a cached registration of a
  // user buffer stays right after the buffer is freed and the address reused. Without it only
  // the backend's own staging memory is registered (see link.h).
  virtual bool follows_mapping() const = 0;
  virtual Result<Mr> reg(void* p, size_t n, bool remote_write) = 0;
  virtual void dereg(Mr& mr) = 0;
  // Memory a peer may write into (the staging slots); freed with free_remote.
  virtual Result<char*> alloc_remote(size_t n) = 0;
  virtual void free_remote(char* p, size_t n) = 0;
  // A queue pair with `depth` sends and receives outstanding; its index and address.
  virtual Result<int> create_qp(int depth, QpAddr* addr) = 0;
  virtual Status connect_qp(int qp, const QpAddr& remote) = 0;
  virtual void destroy_qp(int qp) = 0;
  virtual Status post_recv(int qp, uint64_t wr_id) = 0;
  virtual Status post_write_imm(int qp, uint64_t wr_id, const Mr& local, const char* src, size_t n,
                                uint64_t raddr, uint32_t rkey, uint32_t imm) = 0;
  virtual int poll(int qp, Wc* out, int max) = 0;
  // The peer will write into its memory `rkey` over this queue pair (known once addresses are
  // exchanged). Real verbs: nothing; emulated: maps that memory now, so its name can go.
  virtual Status expect_writes(int /*qp*/, uint32_t /*rkey*/) { return Status::ok(); }
  // Cheap check while idle: is the queue pair's peer still there (emulation: its process)?
  virtual Status peer_alive(int /*qp*/) { return Status::ok(); }
  // After a failed set-up: names this process left for peers that never opened them.
  virtual void unlink_names() {}
};

// Which implementation: the emulation when CHORUS_IB_EMULATE lists devices ("emu0",
// "emu0:1,emu1:1=down"), else libibverbs.
bool emulated();
// The ports there are, active or not; an error when the verbs library cannot be asked.
Result<std::vector<Port>> list_ports();
Result<std::shared_ptr<Nic>> open_nic(const Port& port, int gid_index);

// The implementations' entry points (verbs_emu.cc; verbs_ibv.cc or its stand-in).
Result<std::vector<Port>> emu_list_ports(const std::string& spec);
Result<std::shared_ptr<Nic>> emu_open_nic(const Port& port);
Result<std::vector<Port>> ibv_list_ports();
Result<std::shared_ptr<Nic>> ibv_open_nic(const Port& port, int gid_index);

}  // namespace chorus::transport::ib

// Verbs on a real HCA through libibverbs (verbs.h). The project's machines have no HCA: of this
// file only ibv_list_ports has run (it finds no device there); everything from ibv_open_nic on
// has never run against hardware.
//
// One protection domain and one completion channel per Nic; per queue pair a completion queue
// and an RC QP taken through INIT -> RTR -> RTS with the peer's address (LID for InfiniBand,
// GID at CHORUS_IB_GID_INDEX for RoCE). Completion events wake the channel's thread through
// the channel's descriptor; poll() re-arms notification when it finds the queue empty.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "common/log.h"
#include "transport/ib/verbs.h"

namespace chorus::transport::ib {
namespace {

Status verbs_error(const std::string& dev, const char* call, int err) {
  return make_error(Code::kSystemError, "ib: {}: {} failed: {}", dev, call, strerror(err));
}

class IbvNic final : public Nic {
 public:
  ~IbvNic() override {
    for (Qp& q : qps_) destroy(q);
    if (pd_) ibv_dealloc_pd(pd_);
    if (channel_) ibv_destroy_comp_channel(channel_);
    if (ctx_) ibv_close_device(ctx_);
  }
  static Result<std::shared_ptr<Nic>> open(const Port& port, int gid_index) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return verbs_error(port.device, "ibv_get_device_list", errno);
    std::shared_ptr<IbvNic> nic(new IbvNic());
    nic->name_ = port.name();
    nic->port_ = static_cast<uint8_t>(port.port);
    nic->gid_index_ = gid_index;
    nic->ethernet_ = port.ethernet;
    for (int i = 0; i < n && !nic->ctx_; ++i)
      if (port.device == ibv_get_device_name(list[i])) nic->ctx_ = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!nic->ctx_) return verbs_error(nic->name_, "ibv_open_device", errno ? errno : ENODEV);
    ibv_port_attr pa{};
    if (ibv_query_port(nic->ctx_, nic->port_, &pa) != 0)
      return verbs_error(nic->name_, "ibv_query_port", errno);
    nic->lid_ = pa.lid;
    nic->mtu_ = pa.active_mtu;
    if (ibv_query_gid(nic->ctx_, nic->port_, gid_index, &nic->gid_) != 0)
      return verbs_error(nic->name_, fmt::format("ibv_query_gid (index {})", gid_index).c_str(),
                         errno);
    ibv_device_attr_ex ax{};
    if (ibv_query_device_ex(nic->ctx_, nullptr, &ax) == 0)
      nic->odp_ = (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
                  (ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_SEND);
    nic->pd_ = ibv_alloc_pd(nic->ctx_);
    if (!nic->pd_) return verbs_error(nic->name_, "ibv_alloc_pd", errno);
    nic->channel_ = ibv_create_comp_channel(nic->ctx_);
    if (!nic->channel_) return verbs_error(nic->name_, "ibv_create_comp_channel", errno);
    fcntl(nic->channel_->fd, F_SETFL, fcntl(nic->channel_->fd, F_GETFL) | O_NONBLOCK);
    return std::shared_ptr<Nic>(nic);
  }

  const std::string& name() const override { return name_; }
  bool follows_mapping() const override { return odp_; }

  Result<Mr> reg(void* p, size_t n, bool remote_write) override {
    int access = IBV_ACCESS_LOCAL_WRITE | (remote_write ? IBV_ACCESS_REMOTE_WRITE : 0);
    if (odp_ && !remote_write) access |= IBV_ACCESS_ON_DEMAND;
    ibv_mr* mr = ibv_reg_mr(pd_, p, n, access);
    if (!mr) return verbs_error(name_, fmt::format("ibv_reg_mr ({} bytes)", n).c_str(), errno);
    return Mr{static_cast<char*>(p), n, mr->lkey, mr->rkey, mr};
  }
  void dereg(Mr& mr) override {
    if (mr.handle) ibv_dereg_mr(static_cast<ibv_mr*>(mr.handle));
    mr = Mr{};
  }
  Result<char*> alloc_remote(size_t n) override {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) != 0) return verbs_error(name_, "posix_memalign", ENOMEM);
    return static_cast<char*>(p);
  }
  void free_remote(char* p, size_t) override { std::free(p); }

  Result<int> create_qp(int depth, QpAddr* addr) override {
    Qp q;
    q.cq = ibv_create_cq(ctx_, 2 * depth, nullptr, channel_, 0);
    if (!q.cq) return verbs_error(name_, "ibv_create_cq", errno);
    ibv_req_notify_cq(q.cq, 0);
    ibv_qp_init_attr ia{};
    ia.send_cq = q.cq;
    ia.recv_cq = q.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = depth;
    ia.cap.max_recv_wr = depth;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    q.qp = ibv_create_qp(pd_, &ia);
    if (!q.qp) {
      int e = errno;
      destroy(q);
      return verbs_error(name_, "ibv_create_qp", e);
    }
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port_;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(q.qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      int e = errno;
      destroy(q);
      return verbs_error(name_, "ibv_modify_qp (INIT)", e);
    }
    std::random_device rd;
    q.psn = rd() & 0xffffff;
    addr->qpn = q.qp->qp_num;
    addr->psn = q.psn;
    addr->lid = lid_;
    std::memcpy(addr->gid.data(), gid_.raw, 16);
    qps_.push_back(q);
    return static_cast<int>(qps_.size() - 1);
  }

  Status connect_qp(int i, const QpAddr& r) override {
    Qp& q = qps_.at(i);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu_;
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = port_;
    if (ethernet_) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, r.gid.data(), 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
      a.ah_attr.grh.hop_limit = 255;
    } else {
      a.ah_attr.dlid = r.lid;
    }
    if (ibv_modify_qp(q.qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
      return verbs_error(name_, "ibv_modify_qp (RTR)", errno);
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = 14;
    s.retry_cnt = 7;
    s.rnr_retry = 7;
    s.sq_psn = q.psn;
    s.max_rd_atomic = 1;
    if (ibv_modify_qp(q.qp, &s,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
      return verbs_error(name_, "ibv_modify_qp (RTS)", errno);
    return Status::ok();
  }

  void destroy_qp(int i) override { destroy(qps_.at(i)); }

  Status post_recv(int i, uint64_t wr_id) override {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    int rc = ibv_post_recv(qps_.at(i).qp, &wr, &bad);
    return rc ? verbs_error(name_, "ibv_post_recv", rc) : Status::ok();
  }

  Status post_write_imm(int i, uint64_t wr_id, const Mr& local, const char* src, size_t n,
                        uint64_t raddr, uint32_t rkey, uint32_t imm) override {
    ibv_sge sge{reinterpret_cast<uint64_t>(src), static_cast<uint32_t>(n), local.lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = n ? &sge : nullptr;
    wr.num_sge = n ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(qps_.at(i).qp, &wr, &bad);
    return rc ? verbs_error(name_, "ibv_post_send", rc) : Status::ok();
  }

  int poll(int i, Wc* out, int max) override {
    drain_events();
    Qp& q = qps_.at(i);
    ibv_wc wc[16];
    int k = ibv_poll_cq(q.cq, std::min(max, 16), wc);
    if (k == 0) {  // re-arm, then look once more: a completion may have come in between
      ibv_req_notify_cq(q.cq, 0);
      k = ibv_poll_cq(q.cq, std::min(max, 16), wc);
    }
    for (int j = 0; j < k; ++j)
      out[j] = Wc{wc[j].wr_id, wc[j].opcode == IBV_WC_RECV_RDMA_WITH_IMM,
                  static_cast<int>(wc[j].status), ntohl(wc[j].imm_data), wc[j].byte_len};
    return k < 0 ? 0 : k;
  }

  std::vector<int> poll_fds() const override { return {channel_->fd}; }

 private:
  struct Qp {
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    uint32_t psn = 0;
  };
  void destroy(Qp& q) {
    if (q.qp) ibv_destroy_qp(q.qp);
    if (q.cq) {
      drain_events();
      ibv_ack_cq_events(q.cq, 0);
      ibv_destroy_cq(q.cq);
    }
    q = Qp{};
  }
  // Takes the channel's pending events (non-blocking) and acknowledges them.
  void drain_events() {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }

  std::string name_;
  uint8_t port_ = 1;
  int gid_index_ = 0;
  bool ethernet_ = false;
  bool odp_ = false;
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  ibv_gid gid_{};
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  std::vector<Qp> qps_;
};

}  // namespace

Result<std::vector<Port>> ibv_list_ports() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list && errno == ENOSYS) return std::vector<Port>{};  // no verbs in this kernel: no ports
  if (!list)
    return make_error(Code::kSystemError, "ib: ibv_get_device_list failed: {}", strerror(errno));
  std::vector<Port> out;
  for (int i = 0; i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr da{};
    if (ibv_query_device(ctx, &da) == 0)
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        out.push_back({ibv_get_device_name(list[i]), p, pa.state == IBV_PORT_ACTIVE,
                       pa.link_layer == IBV_LINK_LAYER_ETHERNET});
      }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return out;
}

Result<std::shared_ptr<Nic>> ibv_open_nic(const Port& port, int gid_index) {
  return IbvNic::open(port, gid_index);
}

}  // namespace chorus::transport::ib

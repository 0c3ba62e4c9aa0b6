// tb's shim over Apple's verbs header (macOS 26.2+, librdma.dylib). It makes every verbs call
// whose arguments or results are structs laid out by <infiniband/verbs.h>, so that Rust only
// handles opaque pointers and plain integers. librdma itself is dlopened by Rust
// (rdma/apple.rs); its exported entry points arrive here as function pointers, and the header
// inlines (ibv_post_send, ibv_post_recv, ibv_poll_cq) go through ctx->ops as in JACCL.
// Compiled by build.rs only when the SDK has infiniband/verbs.h.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

typedef struct ibv_qp *(*tb_create_qp_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef int (*tb_modify_qp_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*tb_query_port_fn)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
typedef int (*tb_query_gid_fn)(struct ibv_context *, uint8_t, int, union ibv_gid *);
typedef struct ibv_mr *(*tb_reg_mr_fn)(struct ibv_pd *, void *, size_t, int);

// Completion as Rust sees it. status: 0 success, 1 local length, 2 flushed, 3 RNR retry
// exceeded, 4 remote invalid request, 5 retry exceeded, 1000 + raw value otherwise.
struct tb_wc {
  uint64_t wr_id;
  uint32_t status;
  uint32_t is_recv;
  uint32_t byte_len;
};

// Port attributes as Rust sees them (active_mtu is the ibv_mtu value, 1..5).
struct tb_port {
  uint16_t lid;
  uint32_t gid_tbl_len;
  uint32_t active_mtu;
  uint32_t active;
};

struct ibv_qp *tb_rdma_create_qp(tb_create_qp_fn create_qp, struct ibv_pd *pd,
                                 struct ibv_cq *cq, int uc, uint32_t max_send_wr,
                                 uint32_t max_recv_wr) {
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.cap.max_send_wr = max_send_wr;
  attr.cap.max_recv_wr = max_recv_wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = 0;
  attr.qp_type = uc ? IBV_QPT_UC : IBV_QPT_RC;
  attr.sq_sig_all = 0;
  return create_qp(pd, &attr);
}

uint32_t tb_rdma_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

int tb_rdma_query_port(tb_query_port_fn query_port, struct ibv_context *ctx, uint8_t port,
                       struct tb_port *out) {
  struct ibv_port_attr attr;
  memset(&attr, 0, sizeof(attr));
  int rc = query_port(ctx, port, &attr);
  if (rc != 0) {
    return rc;
  }
  out->lid = attr.lid;
  out->gid_tbl_len = attr.gid_tbl_len < 0 ? 0 : (uint32_t)attr.gid_tbl_len;
  out->active_mtu = (uint32_t)attr.active_mtu;
  out->active = attr.state == IBV_PORT_ACTIVE;
  return 0;
}

int tb_rdma_query_gid(tb_query_gid_fn query_gid, struct ibv_context *ctx, uint8_t port,
                      int index, uint8_t out[16]) {
  union ibv_gid gid;
  memset(&gid, 0, sizeof(gid));
  int rc = query_gid(ctx, port, index, &gid);
  if (rc == 0) {
    memcpy(out, gid.raw, 16);
  }
  return rc;
}

int tb_rdma_modify_init(tb_modify_qp_fn modify_qp, struct ibv_qp *qp, uint8_t port) {
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = port;
  attr.pkey_index = 0;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
  return modify_qp(qp, &attr,
                   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int tb_rdma_modify_rtr(tb_modify_qp_fn modify_qp, struct ibv_qp *qp, uint32_t dest_qpn,
                       uint32_t rq_psn, uint16_t dlid, const uint8_t gid[16], int use_gid,
                       uint8_t sgid_index, uint8_t port, uint32_t mtu, int rc_qp) {
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = (enum ibv_mtu)mtu;
  attr.rq_psn = rq_psn;
  attr.dest_qp_num = dest_qpn;
  attr.ah_attr.dlid = dlid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = port;
  attr.ah_attr.is_global = 0;
  if (use_gid) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.hop_limit = 1;
    memcpy(attr.ah_attr.grh.dgid.raw, gid, 16);
    attr.ah_attr.grh.sgid_index = sgid_index;
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (rc_qp) {
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return modify_qp(qp, &attr, mask);
}

int tb_rdma_modify_rts(tb_modify_qp_fn modify_qp, struct ibv_qp *qp, uint32_t sq_psn,
                       int rc_qp) {
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = sq_psn;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (rc_qp) {
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 1;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return modify_qp(qp, &attr, mask);
}

struct ibv_mr *tb_rdma_reg_mr(tb_reg_mr_fn reg_mr, struct ibv_pd *pd, void *addr, size_t len,
                              uint32_t *lkey) {
  struct ibv_mr *mr = reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
  if (mr != NULL) {
    *lkey = mr->lkey;
  }
  return mr;
}

int tb_rdma_post_send(struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey,
                      uint64_t wr_id) {
  struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
  struct ibv_send_wr wr;
  struct ibv_send_wr *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.next = NULL;
  return ibv_post_send(qp, &wr, &bad);
}

int tb_rdma_post_recv(struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey,
                      uint64_t wr_id) {
  struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
  struct ibv_recv_wr wr;
  struct ibv_recv_wr *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.next = NULL;
  return ibv_post_recv(qp, &wr, &bad);
}

static uint32_t tb_status(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return 0;
    case IBV_WC_LOC_LEN_ERR:
      return 1;
    case IBV_WC_WR_FLUSH_ERR:
      return 2;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return 3;
    case IBV_WC_REM_INV_REQ_ERR:
      return 4;
    case IBV_WC_RETRY_EXC_ERR:
      return 5;
    default:
      return 1000u + (uint32_t)s;
  }
}

int tb_rdma_poll_cq(struct ibv_cq *cq, int max, struct tb_wc *out) {
  struct ibv_wc wc[64];
  if (max > 64) {
    max = 64;
  }
  int n = ibv_poll_cq(cq, max, wc);
  for (int i = 0; i < n; i++) {
    out[i].wr_id = wc[i].wr_id;
    out[i].status = tb_status(wc[i].status);
    out[i].is_recv = (wc[i].opcode & IBV_WC_RECV) != 0;
    out[i].byte_len = wc[i].byte_len;
  }
  return n;
}

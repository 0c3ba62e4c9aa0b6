//! The simulated fabric: every device, queue pair, completion queue and registered memory region
//! of one process, the messages on the wire between queue pairs, and the fault plan. All state
//! sits behind one mutex, so the model is sequentially consistent and deterministic (delays are
//! the only use of the clock).
//!
//! Semantics modelled (two-sided SEND/RECV only; MTU segmentation is not modelled):
//! - A SEND leaves at post time. UC: the sender's completion is generated at once (no acks).
//!   RC: the sender's completion comes when the message has been placed (or failed).
//! - An arriving message consumes the target queue pair's oldest posted RECV. With no RECV
//!   posted, UC drops it silently; RC fails the sender with RNR and moves its QP to error.
//! - A message longer than the RECV: the RECV completes with a local length error and the
//!   receiving QP goes to the error state (RC: the sender gets a remote invalid request error).
//! - A message for a QP that is gone, not in RTR/RTS, or not connected to the sender is dropped
//!   (RC: the sender gets retry exceeded).
//! - An error completion moves its QP to the error state: posted RECVs are flushed, later posts
//!   complete as flushed.
//! - A completion queue that is full when a completion arrives overflows: the completion is lost,
//!   every QP on it goes to error and `poll_cq` reports the overflow from then on.
//! - Received bytes are written into the RECV's memory when the receiver polls the completion
//!   (on the receiver's thread), which is when a real receiver may first look at them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::rdma::verbs::{Gid, QpCaps, QpType, VerbsError, WcOpcode, WcStatus, WorkCompletion};

/// Counters of what the fabric did; tests assert on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Messages placed into a posted RECV.
    pub delivered: u64,
    /// UC messages dropped because the target had no RECV posted.
    pub dropped_no_recv: u64,
    /// Messages dropped by the fault plan ([`super::Fabric::drop_next_sends`]).
    pub dropped_by_fault: u64,
    /// Messages dropped because the target QP was gone, not ready or not connected to the sender.
    pub dropped_unreachable: u64,
    /// RECVs that completed with a local length error.
    pub length_errors: u64,
    /// Completion-queue overflows.
    pub cq_overflows: u64,
    /// The most RECVs ever posted at once on one QP.
    pub max_posted_recvs: u64,
}

/// Queue-pair state as in `ibv_qp_state` (the states tb goes through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimQpState {
    /// Created.
    Reset,
    /// RECVs may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: everything posted is flushed.
    Error,
}

/// A device of the fabric.
#[derive(Debug, Clone)]
pub(crate) struct Device {
    pub(crate) gids: Vec<Gid>,
    pub(crate) lid: u16,
}

#[derive(Debug)]
struct PostedRecv {
    wr_id: u64,
    mr: u32,
    offset: usize,
    len: usize,
}

#[derive(Debug)]
struct Qp {
    device: String,
    cq: u64,
    qp_type: QpType,
    caps: QpCaps,
    state: SimQpState,
    /// (remote qpn, remote gid) once in RTR.
    remote: Option<(u32, Gid)>,
    /// The GID this QP sends from (the device's GID at the RTR's sgid index).
    source_gid: Option<Gid>,
    rq: VecDeque<PostedRecv>,
    /// RC sends waiting for their placement.
    rc_pending: u32,
}

#[derive(Debug)]
struct Cq {
    depth: u32,
    entries: VecDeque<Entry>,
    overflowed: bool,
}

/// A completion with, for a successful RECV, the bytes to place when it is polled.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) wc: WorkCompletion,
    pub(crate) place: Option<Placement>,
}

/// Bytes to write into registered memory.
#[derive(Debug)]
pub(crate) struct Placement {
    pub(crate) mr: u32,
    pub(crate) offset: usize,
    pub(crate) data: Vec<u8>,
}

#[derive(Debug)]
struct InFlight {
    deliver_at: Instant,
    to_qpn: u32,
    to_gid: Gid,
    from_gid: Gid,
    data: Vec<u8>,
    wr_id: u64,
}

/// The registration of a memory region: where it is and how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrInfo {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

/// Fault injection settings.
#[derive(Debug, Default)]
struct Faults {
    drop_next: HashMap<u32, u32>,
    delay: HashMap<u32, Duration>,
    cq_cap: Option<u32>,
    no_uc: bool,
}

/// Everything behind the fabric's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) devices: BTreeMap<String, Device>,
    qps: BTreeMap<u32, Qp>,
    cqs: HashMap<u64, Cq>,
    pub(crate) mrs: HashMap<u32, MrInfo>,
    /// Per sending QP, its messages in flight, in order.
    wire: BTreeMap<u32, VecDeque<InFlight>>,
    faults: Faults,
    pub(crate) stats: SimStats,
    next_qpn: u32,
    next_cq: u64,
    next_mr: u32,
}

fn call(op: &'static str, detail: impl Into<String>) -> VerbsError {
    VerbsError::Call {
        op,
        detail: detail.into(),
    }
}

impl State {
    pub(crate) fn add_device(&mut self, name: &str) -> Gid {
        let index = self.devices.len() as u32 + 1;
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[12..].copy_from_slice(&index.to_be_bytes());
        let mut mapped = [0u8; 16];
        mapped[10] = 0xff;
        mapped[11] = 0xff;
        mapped[12] = 10;
        mapped[13] = 0;
        mapped[14..].copy_from_slice(&(index as u16).to_be_bytes());
        self.devices.insert(
            name.to_string(),
            Device {
                gids: vec![link_local, mapped],
                lid: 0,
            },
        );
        mapped
    }

    pub(crate) fn create_cq(&mut self, depth: u32) -> u64 {
        self.next_cq += 1;
        let depth = match self.faults.cq_cap {
            Some(cap) => depth.min(cap),
            None => depth,
        };
        self.cqs.insert(
            self.next_cq,
            Cq {
                depth,
                entries: VecDeque::new(),
                overflowed: false,
            },
        );
        self.next_cq
    }

    pub(crate) fn destroy_cq(&mut self, cq: u64) {
        self.cqs.remove(&cq);
    }

    pub(crate) fn create_qp(
        &mut self,
        device: &str,
        cq: u64,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<u32, VerbsError> {
        if qp_type == QpType::Uc && self.faults.no_uc {
            return Err(call(
                "ibv_create_qp",
                "UC queue pairs are not supported by this (simulated) device",
            ));
        }
        if !self.cqs.contains_key(&cq) {
            return Err(call("ibv_create_qp", "unknown completion queue"));
        }
        self.next_qpn += 1;
        let qpn = 0x100 + self.next_qpn;
        self.qps.insert(
            qpn,
            Qp {
                device: device.to_string(),
                cq,
                qp_type,
                caps,
                state: SimQpState::Reset,
                remote: None,
                source_gid: None,
                rq: VecDeque::new(),
                rc_pending: 0,
            },
        );
        Ok(qpn)
    }

    pub(crate) fn destroy_qp(&mut self, qpn: u32) {
        self.qps.remove(&qpn);
        self.wire.remove(&qpn);
        self.faults.drop_next.remove(&qpn);
        self.faults.delay.remove(&qpn);
    }

    pub(crate) fn register(&mut self, info: MrInfo) -> u32 {
        self.next_mr += 1;
        self.mrs.insert(self.next_mr, info);
        self.next_mr
    }

    pub(crate) fn deregister(&mut self, mr: u32) {
        self.mrs.remove(&mr);
    }

    fn qp_mut(&mut self, qpn: u32, op: &'static str) -> Result<&mut Qp, VerbsError> {
        self.qps
            .get_mut(&qpn)
            .ok_or_else(|| call(op, format!("queue pair {qpn} does not exist")))
    }

    pub(crate) fn modify_to_init(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let qp = self.qp_mut(qpn, "ibv_modify_qp(INIT)")?;
        if qp.state != SimQpState::Reset {
            return Err(call(
                "ibv_modify_qp(INIT)",
                format!("queue pair {qpn} is in {:?}, not RESET", qp.state),
            ));
        }
        qp.state = SimQpState::Init;
        Ok(())
    }

    pub(crate) fn modify_to_rtr(
        &mut self,
        qpn: u32,
        remote_qpn: u32,
        remote_gid: Gid,
        remote_type: QpType,
        sgid_index: u8,
    ) -> Result<(), VerbsError> {
        let op = "ibv_modify_qp(RTR)";
        let device = self.qp_mut(qpn, op)?.device.clone();
        let source_gid = self
            .devices
            .get(&device)
            .and_then(|d| d.gids.get(usize::from(sgid_index)).copied())
            .ok_or_else(|| call(op, format!("no GID at index {sgid_index} on `{device}`")))?;
        let qp = self.qp_mut(qpn, op)?;
        if qp.state != SimQpState::Init {
            return Err(call(
                op,
                format!("queue pair {qpn} is in {:?}, not INIT", qp.state),
            ));
        }
        if qp.qp_type != remote_type {
            return Err(call(
                op,
                format!(
                    "queue pair {qpn} is {:?} but the remote is {remote_type:?}",
                    qp.qp_type
                ),
            ));
        }
        qp.remote = Some((remote_qpn, remote_gid));
        qp.source_gid = Some(source_gid);
        qp.state = SimQpState::Rtr;
        Ok(())
    }

    pub(crate) fn modify_to_rts(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let qp = self.qp_mut(qpn, "ibv_modify_qp(RTS)")?;
        if qp.state != SimQpState::Rtr {
            return Err(call(
                "ibv_modify_qp(RTS)",
                format!("queue pair {qpn} is in {:?}, not RTR", qp.state),
            ));
        }
        qp.state = SimQpState::Rts;
        Ok(())
    }

    /// Pushes a completion; a full CQ overflows and takes its QPs to the error state.
    fn push(&mut self, cq_id: u64, entry: Entry) {
        let Some(cq) = self.cqs.get_mut(&cq_id) else {
            return;
        };
        if cq.overflowed {
            return;
        }
        if cq.entries.len() >= cq.depth as usize {
            cq.overflowed = true;
            self.stats.cq_overflows += 1;
            let on_cq: Vec<u32> = self
                .qps
                .iter()
                .filter(|(_, qp)| qp.cq == cq_id)
                .map(|(qpn, _)| *qpn)
                .collect();
            for qpn in on_cq {
                self.fail_qp(qpn);
            }
            return;
        }
        cq.entries.push_back(entry);
    }

    fn complete(&mut self, qpn: u32, wr_id: u64, opcode: WcOpcode, status: WcStatus, len: u32) {
        let Some(cq) = self.qps.get(&qpn).map(|qp| qp.cq) else {
            return;
        };
        self.push(
            cq,
            Entry {
                wc: WorkCompletion {
                    wr_id,
                    status,
                    opcode,
                    byte_len: len,
                },
                place: None,
            },
        );
        if status != WcStatus::Success {
            self.fail_qp(qpn);
        }
    }

    /// Moves a QP to the error state and flushes its posted RECVs.
    pub(crate) fn fail_qp(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.state == SimQpState::Error {
            return;
        }
        qp.state = SimQpState::Error;
        let cq = qp.cq;
        let flushed: Vec<PostedRecv> = qp.rq.drain(..).collect();
        for r in flushed {
            self.push(
                cq,
                Entry {
                    wc: WorkCompletion {
                        wr_id: r.wr_id,
                        status: WcStatus::Flushed,
                        opcode: WcOpcode::Recv,
                        byte_len: 0,
                    },
                    place: None,
                },
            );
        }
    }

    pub(crate) fn post_recv(
        &mut self,
        qpn: u32,
        mr: u32,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let op = "ibv_post_recv";
        if !self.mrs.contains_key(&mr) {
            return Err(call(op, format!("memory region {mr} is not registered")));
        }
        let qp = self.qp_mut(qpn, op)?;
        match qp.state {
            SimQpState::Reset => {
                return Err(call(op, format!("queue pair {qpn} is in RESET")));
            }
            SimQpState::Error => {
                self.complete(qpn, wr_id, WcOpcode::Recv, WcStatus::Flushed, 0);
                return Ok(());
            }
            _ => {}
        }
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(call(
                op,
                format!(
                    "receive queue of queue pair {qpn} is full ({} WRs)",
                    qp.caps.max_recv_wr
                ),
            ));
        }
        qp.rq.push_back(PostedRecv {
            wr_id,
            mr,
            offset,
            len,
        });
        let posted = qp.rq.len() as u64;
        self.stats.max_posted_recvs = self.stats.max_posted_recvs.max(posted);
        Ok(())
    }

    pub(crate) fn post_send(
        &mut self,
        qpn: u32,
        data: Vec<u8>,
        wr_id: u64,
        now: Instant,
    ) -> Result<(), VerbsError> {
        let op = "ibv_post_send";
        let qp = self.qp_mut(qpn, op)?;
        match qp.state {
            SimQpState::Rts => {}
            SimQpState::Error => {
                self.complete(qpn, wr_id, WcOpcode::Send, WcStatus::Flushed, 0);
                return Ok(());
            }
            other => {
                return Err(call(
                    op,
                    format!("queue pair {qpn} is in {other:?}, not RTS"),
                ));
            }
        }
        let qp_type = qp.qp_type;
        if qp_type == QpType::Rc && qp.rc_pending >= qp.caps.max_send_wr {
            return Err(call(
                op,
                format!(
                    "send queue of queue pair {qpn} is full ({} WRs)",
                    qp.caps.max_send_wr
                ),
            ));
        }
        let (Some((to_qpn, to_gid)), Some(from_gid)) = (qp.remote, qp.source_gid) else {
            return Err(call(op, format!("queue pair {qpn} is not connected")));
        };
        if qp_type == QpType::Rc {
            qp.rc_pending += 1;
        }
        if let Some(n) = self.faults.drop_next.get_mut(&qpn).filter(|n| **n > 0) {
            *n -= 1;
            self.stats.dropped_by_fault += 1;
            match qp_type {
                QpType::Uc => self.complete(qpn, wr_id, WcOpcode::Send, WcStatus::Success, 0),
                QpType::Rc => {
                    self.rc_done(qpn);
                    self.complete(qpn, wr_id, WcOpcode::Send, WcStatus::RetryExceeded, 0)
                }
            }
            return Ok(());
        }
        let delay = self.faults.delay.get(&qpn).copied().unwrap_or_default();
        self.wire.entry(qpn).or_default().push_back(InFlight {
            deliver_at: now + delay,
            to_qpn,
            to_gid,
            from_gid,
            data,
            wr_id,
        });
        if qp_type == QpType::Uc {
            self.complete(qpn, wr_id, WcOpcode::Send, WcStatus::Success, 0);
        }
        self.deliver_due(now);
        Ok(())
    }

    fn rc_done(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.rc_pending = qp.rc_pending.saturating_sub(1);
        }
    }

    /// Delivers every message whose time has come, in order per sending QP.
    pub(crate) fn deliver_due(&mut self, now: Instant) {
        let senders: Vec<u32> = self.wire.keys().copied().collect();
        for from in senders {
            loop {
                let ready = self
                    .wire
                    .get(&from)
                    .and_then(|q| q.front())
                    .is_some_and(|m| m.deliver_at <= now);
                if !ready {
                    break;
                }
                let Some(msg) = self.wire.get_mut(&from).and_then(|q| q.pop_front()) else {
                    break;
                };
                self.arrive(from, msg);
            }
        }
        self.wire.retain(|_, q| !q.is_empty());
    }

    fn arrive(&mut self, from: u32, msg: InFlight) {
        let sender_type = self.qps.get(&from).map(|q| q.qp_type);
        let sender_result = |status| (sender_type == Some(QpType::Rc)).then_some(status);
        let reachable = self.qps.get(&msg.to_qpn).is_some_and(|t| {
            matches!(t.state, SimQpState::Rtr | SimQpState::Rts)
                && t.remote.map(|(q, _)| q) == Some(from)
                && self
                    .devices
                    .get(&t.device)
                    .is_some_and(|d| d.gids.contains(&msg.to_gid))
                && t.remote.map(|(_, g)| g) == Some(msg.from_gid)
        });
        let outcome = if !reachable {
            self.stats.dropped_unreachable += 1;
            sender_result(WcStatus::RetryExceeded)
        } else {
            self.place(msg.to_qpn, &msg, sender_type)
        };
        if let Some(status) = outcome {
            self.rc_done(from);
            self.complete(from, msg.wr_id, WcOpcode::Send, status, 0);
        }
    }

    /// Places `msg` into the target's oldest RECV; returns the RC sender's status, if any.
    fn place(&mut self, to: u32, msg: &InFlight, sender_type: Option<QpType>) -> Option<WcStatus> {
        let rc = sender_type == Some(QpType::Rc);
        let Some(target) = self.qps.get_mut(&to) else {
            return rc.then_some(WcStatus::RetryExceeded);
        };
        let Some(recv) = target.rq.pop_front() else {
            if rc {
                return Some(WcStatus::ReceiverNotReady);
            }
            self.stats.dropped_no_recv += 1;
            return None;
        };
        let cq = target.cq;
        if msg.data.len() > recv.len {
            self.stats.length_errors += 1;
            self.complete(to, recv.wr_id, WcOpcode::Recv, WcStatus::LocalLength, 0);
            return rc.then_some(WcStatus::RemoteInvalidRequest);
        }
        self.stats.delivered += 1;
        let len = msg.data.len();
        self.push(
            cq,
            Entry {
                wc: WorkCompletion {
                    wr_id: recv.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: len as u32,
                },
                place: Some(Placement {
                    mr: recv.mr,
                    offset: recv.offset,
                    data: msg.data.clone(),
                }),
            },
        );
        rc.then_some(WcStatus::Success)
    }

    /// Takes up to `max` completions off `cq`.
    pub(crate) fn poll(&mut self, cq_id: u64, max: usize) -> Result<Vec<Entry>, VerbsError> {
        let cq = self
            .cqs
            .get_mut(&cq_id)
            .ok_or_else(|| call("ibv_poll_cq", "unknown completion queue"))?;
        if cq.overflowed {
            return Err(VerbsError::CqOverflow { depth: cq.depth });
        }
        let n = max.min(cq.entries.len());
        Ok(cq.entries.drain(..n).collect())
    }

    pub(crate) fn drop_next_sends(&mut self, qpn: u32, n: u32) {
        self.faults.drop_next.insert(qpn, n);
    }

    pub(crate) fn set_delay(&mut self, qpn: u32, delay: Duration) {
        self.faults.delay.insert(qpn, delay);
    }

    pub(crate) fn cap_cq_depth(&mut self, cap: Option<u32>) {
        self.faults.cq_cap = cap;
    }

    pub(crate) fn set_no_uc(&mut self, no_uc: bool) {
        self.faults.no_uc = no_uc;
    }

    pub(crate) fn qp_state(&self, qpn: u32) -> Option<SimQpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// The QP on `local` connected to a QP on `remote`.
    pub(crate) fn qp_between(&self, local: &str, remote: &str) -> Option<u32> {
        self.qps.iter().find_map(|(qpn, qp)| {
            let (rq, _) = qp.remote?;
            let other = self.qps.get(&rq)?;
            (qp.device == local && other.device == remote).then_some(*qpn)
        })
    }
}

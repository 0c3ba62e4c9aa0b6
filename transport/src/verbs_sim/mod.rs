//! An in-process verbs provider — a simulation, named as such. It implements
//! [`Verbs`](crate::rdma::verbs::Verbs) over memory, between queue pairs created in
//! one process (typically one thread per simulated rank), so the RDMA transport's protocol —
//! credits, chunking, ordering, error handling — runs and is tested on machines without an RDMA
//! device. It is not a transport anyone should deploy: [`crate::rdma::open`] never
//! picks it.
//!
//! What it models is listed in [`fabric`]; the parts that matter most for UC are that a SEND
//! which finds no posted RECV vanishes without an error anywhere, and that completion queues have
//! a depth. A [`Fabric`] also injects faults: drop the next SENDs of a queue pair, delay its
//! messages, kill a queue pair (to the error state), cap every completion queue's depth, refuse
//! UC queue pairs.

pub mod fabric;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::rdma::verbs::{
    Gid, MemoryRegion, PathParams, PortInfo, QpCaps, QpEndpoint, QpType, Region, Verbs, VerbsError,
    WorkCompletion,
};
use fabric::{MrInfo, State};
pub use fabric::{SimQpState, SimStats};

/// The simulated network: devices, queue pairs and the wire between them. Share it (it is an
/// `Arc`) between the ranks' [`SimVerbs`].
#[derive(Debug, Default)]
pub struct Fabric {
    state: Mutex<State>,
}

impl Fabric {
    /// A fabric with the named devices (each gets a link-local GID at index 0 and an
    /// IPv4-mapped GID `::ffff:10.0.x.y` at index 1, as Apple's Thunderbolt devices have).
    pub fn new(devices: &[&str]) -> Arc<Self> {
        let fabric = Arc::new(Fabric::default());
        {
            let mut st = fabric.lock();
            for d in devices {
                st.add_device(d);
            }
        }
        fabric
    }

    /// A verbs provider on this fabric.
    pub fn verbs(self: &Arc<Self>) -> SimVerbs {
        SimVerbs {
            fabric: Arc::clone(self),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (a failed test thread) leaves consistent state: every
        // mutation is completed before anything that can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the fabric did so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats.clone()
    }

    /// The next `n` SENDs posted on queue pair `qpn` are lost on the wire (UC: the sender still
    /// sees success; RC: the sender gets retry exceeded).
    pub fn drop_next_sends(&self, qpn: u32, n: u32) {
        self.lock().drop_next_sends(qpn, n);
    }

    /// Messages sent from `qpn` arrive `delay` after they were posted (order is kept).
    pub fn set_delay(&self, qpn: u32, delay: Duration) {
        self.lock().set_delay(qpn, delay);
    }

    /// Moves queue pair `qpn` to the error state, as a fatal device error would: its posted
    /// RECVs complete as flushed, later posts too, and messages for it are dropped.
    pub fn kill_qp(&self, qpn: u32) {
        self.lock().fail_qp(qpn);
    }

    /// Completion queues created from now on get at most `cap` entries, whatever was asked (as a
    /// device with a small maximum would); `None` lifts the cap.
    pub fn cap_cq_depth(&self, cap: Option<u32>) {
        self.lock().cap_cq_depth(cap);
    }

    /// Refuse to create UC queue pairs (a device with RC only).
    pub fn refuse_uc(&self, refuse: bool) {
        self.lock().set_no_uc(refuse);
    }

    /// The state of queue pair `qpn`, if it exists.
    pub fn qp_state(&self, qpn: u32) -> Option<SimQpState> {
        self.lock().qp_state(qpn)
    }

    /// The queue pair on device `local` that is connected to one on device `remote`.
    pub fn qp_between(&self, local: &str, remote: &str) -> Option<u32> {
        self.lock().qp_between(local, remote)
    }
}

/// The verbs provider over a [`Fabric`].
#[derive(Debug, Clone)]
pub struct SimVerbs {
    fabric: Arc<Fabric>,
}

impl SimVerbs {
    /// The fabric this provider lives on.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }
}

/// An open simulated device.
#[derive(Debug)]
pub struct SimContext {
    device: String,
}

/// A simulated protection domain.
#[derive(Debug)]
pub struct SimPd {
    device: String,
}

/// A simulated completion queue (destroyed on drop).
#[derive(Debug)]
pub struct SimCq {
    id: u64,
    fabric: Arc<Fabric>,
}

impl Drop for SimCq {
    fn drop(&mut self) {
        self.fabric.lock().destroy_cq(self.id);
    }
}

/// A simulated queue pair (destroyed on drop).
#[derive(Debug)]
pub struct SimQp {
    qpn: u32,
    fabric: Arc<Fabric>,
}

impl SimQp {
    /// The queue-pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.fabric.lock().destroy_qp(self.qpn);
    }
}

/// A simulated registered memory region. Dropping it deregisters (under the fabric's lock)
/// before its memory is freed.
#[derive(Debug)]
pub struct SimMr {
    id: u32,
    region: Region,
    fabric: Arc<Fabric>,
}

impl Drop for SimMr {
    fn drop(&mut self) {
        // Runs before the fields drop: the registration is gone before `region` is freed.
        self.fabric.lock().deregister(self.id);
    }
}

impl MemoryRegion for SimMr {
    fn region(&self) -> &Region {
        &self.region
    }
    fn region_mut(&mut self) -> &mut Region {
        &mut self.region
    }
}

impl SimVerbs {
    fn check_mr(&self, mr: &SimMr, offset: usize, len: usize) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(&mr.fabric, &self.fabric) {
            return Err(VerbsError::Invalid(
                "memory region of another fabric".into(),
            ));
        }
        mr.region.check_range(offset, len)
    }
}

impl Verbs for SimVerbs {
    type Context = SimContext;
    type Pd = SimPd;
    type Cq = SimCq;
    type Qp = SimQp;
    type Mr = SimMr;

    fn provider(&self) -> &'static str {
        "verbs_sim"
    }

    fn device_names(&self) -> Result<Vec<String>, VerbsError> {
        Ok(self.fabric.lock().devices.keys().cloned().collect())
    }

    fn open(&self, name: &str) -> Result<SimContext, VerbsError> {
        let st = self.fabric.lock();
        if st.devices.is_empty() {
            return Err(VerbsError::NoDevice {
                provider: "verbs_sim",
                detail: "the simulated fabric has no devices".into(),
            });
        }
        if !st.devices.contains_key(name) {
            return Err(VerbsError::DeviceNotFound {
                provider: "verbs_sim",
                name: name.to_string(),
                available: st.devices.keys().cloned().collect(),
            });
        }
        Ok(SimContext {
            device: name.to_string(),
        })
    }

    fn alloc_pd(&self, ctx: &SimContext) -> Result<SimPd, VerbsError> {
        Ok(SimPd {
            device: ctx.device.clone(),
        })
    }

    fn create_cq(&self, _ctx: &SimContext, depth: u32) -> Result<SimCq, VerbsError> {
        if depth == 0 {
            return Err(VerbsError::Invalid("completion queue of depth 0".into()));
        }
        let id = self.fabric.lock().create_cq(depth);
        Ok(SimCq {
            id,
            fabric: Arc::clone(&self.fabric),
        })
    }

    fn create_qp(
        &self,
        pd: &SimPd,
        cq: &SimCq,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<SimQp, VerbsError> {
        let qpn = self
            .fabric
            .lock()
            .create_qp(&pd.device, cq.id, qp_type, caps)?;
        Ok(SimQp {
            qpn,
            fabric: Arc::clone(&self.fabric),
        })
    }

    fn qp_num(&self, qp: &SimQp) -> u32 {
        qp.qpn
    }

    fn query_port(&self, ctx: &SimContext, port: u8) -> Result<PortInfo, VerbsError> {
        if port != 1 {
            return Err(VerbsError::Call {
                op: "ibv_query_port",
                detail: format!("port {port} does not exist (only port 1)"),
            });
        }
        let st = self.fabric.lock();
        let dev = st
            .devices
            .get(&ctx.device)
            .ok_or_else(|| VerbsError::Call {
                op: "ibv_query_port",
                detail: format!("device `{}` is gone", ctx.device),
            })?;
        Ok(PortInfo {
            lid: dev.lid,
            gid_table_len: dev.gids.len() as u32,
            active_mtu: 1024,
            active: true,
        })
    }

    fn query_gid(&self, ctx: &SimContext, port: u8, index: u32) -> Result<Gid, VerbsError> {
        let st = self.fabric.lock();
        st.devices
            .get(&ctx.device)
            .filter(|_| port == 1)
            .and_then(|d| d.gids.get(index as usize).copied())
            .ok_or_else(|| VerbsError::Call {
                op: "ibv_query_gid",
                detail: format!("no GID {index} on port {port} of `{}`", ctx.device),
            })
    }

    fn modify_to_init(&self, qp: &mut SimQp, _port: u8) -> Result<(), VerbsError> {
        self.fabric.lock().modify_to_init(qp.qpn)
    }

    fn modify_to_rtr(
        &self,
        qp: &mut SimQp,
        remote: &QpEndpoint,
        path: &PathParams,
    ) -> Result<(), VerbsError> {
        crate::rdma::verbs::mtu_code(path.mtu)?;
        self.fabric.lock().modify_to_rtr(
            qp.qpn,
            remote.qpn,
            remote.gid,
            remote.qp_type,
            path.sgid_index,
        )
    }

    fn modify_to_rts(&self, qp: &mut SimQp, _psn: u32) -> Result<(), VerbsError> {
        self.fabric.lock().modify_to_rts(qp.qpn)
    }

    fn reg_mr(&self, _pd: &SimPd, region: Region) -> Result<SimMr, VerbsError> {
        let id = self.fabric.lock().register(MrInfo {
            addr: region.as_ptr() as usize,
            len: region.len(),
        });
        Ok(SimMr {
            id,
            region,
            fabric: Arc::clone(&self.fabric),
        })
    }

    fn post_send(
        &self,
        qp: &mut SimQp,
        mr: &SimMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        self.check_mr(mr, offset, len)?;
        // The bytes leave now: copying them here is the simulated DMA read.
        let data = mr.region.bytes()[offset..offset + len].to_vec();
        self.fabric
            .lock()
            .post_send(qp.qpn, data, wr_id, Instant::now())
    }

    fn post_recv(
        &self,
        qp: &mut SimQp,
        mr: &SimMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        self.check_mr(mr, offset, len)?;
        self.fabric
            .lock()
            .post_recv(qp.qpn, mr.id, offset, len, wr_id)
    }

    fn poll_cq(
        &self,
        cq: &mut SimCq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        let mut st = self.fabric.lock();
        st.deliver_due(Instant::now());
        let entries = st.poll(cq.id, max)?;
        for e in &entries {
            // A region deregistered since the RECV was posted gets nothing (its owner is being
            // dropped and will not look).
            if let Some(p) = &e.place
                && let Some(info) = st.mrs.get(&p.mr)
                && p.offset + p.data.len() <= info.len
            {
                // SAFETY: `info` describes a live allocation: a SimMr deregisters under
                // this lock before its Region is freed, and we hold the lock. The range
                // was checked against the region when the RECV was posted (and again
                // just above). By the verbs contract the owner does not touch a range
                // named by a posted RECV until it has polled that RECV's completion,
                // which is what this call (on the owner's thread, with `&mut` to its CQ)
                // is doing; the source is a separate Vec, so the ranges cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        p.data.as_ptr(),
                        (info.addr as *mut u8).add(p.offset),
                        p.data.len(),
                    );
                }
            }
        }
        out.extend(entries.iter().map(|e| e.wc));
        Ok(entries.len())
    }
}

#[cfg(test)]
mod tests;

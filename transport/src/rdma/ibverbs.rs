//! The [`Verbs`] provider over rdma-core's libibverbs (Linux, feature `rdma`), through the
//! bindgen'd `rdma-sys`. On a machine with no RDMA device (no driver, no rxe/siw)
//! `ibv_get_device_list` returns NULL (errno ENOSYS) or an empty list: [`IbVerbs::open`] then
//! fails with [`VerbsError::NoDevice`], which the transport reports as `Unsupported` so that the
//! selection falls back to TCP.
//!
//! Every handle owns its verbs object and destroys it on drop; children hold an `Arc` of their
//! parents (QP → PD, CQ → device context), so a parent is never destroyed first.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use rdma_sys::{
    ___ibv_query_port, ibv_access_flags, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_cq,
    ibv_create_cq, ibv_create_qp, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_cq, ibv_destroy_qp,
    ibv_device, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid,
    ibv_modify_qp, ibv_mr, ibv_mtu, ibv_open_device, ibv_pd, ibv_poll_cq, ibv_port_attr,
    ibv_port_state, ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_query_gid, ibv_recv_wr, ibv_reg_mr,
    ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode,
};

use super::verbs::{
    Gid, MemoryRegion, PathParams, PortInfo, QpCaps, QpEndpoint, QpType, Region, Verbs, VerbsError,
    WcOpcode, WcStatus, WorkCompletion, mtu_bytes, mtu_code,
};

const PROVIDER: &str = "libibverbs";

fn call(op: &'static str, rc: c_int) -> VerbsError {
    // Verbs calls return an errno value (or -1 with errno set).
    let err = if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    };
    VerbsError::Call {
        op,
        detail: err.to_string(),
    }
}

fn null(op: &'static str) -> VerbsError {
    VerbsError::Call {
        op,
        detail: std::io::Error::last_os_error().to_string(),
    }
}

/// The libibverbs provider (stateless: the library keeps the device list).
#[derive(Debug, Clone, Copy, Default)]
pub struct IbVerbs;

/// The device list, freed on drop.
struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned list is freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::NoDevice {
                provider: PROVIDER,
                detail: format!("ibv_get_device_list: {}", std::io::Error::last_os_error()),
            });
        }
        let list = DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        };
        if list.len == 0 {
            return Err(VerbsError::NoDevice {
                provider: PROVIDER,
                detail: "ibv_get_device_list found no device".into(),
            });
        }
        Ok(list)
    }

    fn devices(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: `list` holds `len` valid device pointers while self lives.
            let dev = unsafe { *self.list.add(i) };
            // SAFETY: ibv_get_device_name returns a NUL-terminated string owned by the device.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            (dev, name)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: from ibv_get_device_list, freed once; opened contexts stay valid.
        unsafe { ibv_free_device_list(self.list) }
    }
}

struct CtxInner(*mut ibv_context);
// SAFETY: libibverbs objects may be used from any thread; each handle is owned by one value.
unsafe impl Send for CtxInner {}
// SAFETY: as above; shared references only reach thread-safe verbs calls.
unsafe impl Sync for CtxInner {}
impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every child holds an Arc of this, so none is left.
        unsafe { ibv_close_device(self.0) };
    }
}

/// An open device.
pub struct IbContext(Arc<CtxInner>);

struct PdInner {
    raw: *mut ibv_pd,
    _ctx: Arc<CtxInner>,
}
// SAFETY: see CtxInner.
unsafe impl Send for PdInner {}
// SAFETY: see CtxInner.
unsafe impl Sync for PdInner {}
impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: from ibv_alloc_pd; QPs and MRs hold an Arc of this, so none is left.
        unsafe { ibv_dealloc_pd(self.raw) };
    }
}

/// A protection domain.
pub struct IbPd(Arc<PdInner>);

struct CqInner {
    raw: *mut ibv_cq,
    _ctx: Arc<CtxInner>,
}
// SAFETY: see CtxInner.
unsafe impl Send for CqInner {}
// SAFETY: see CtxInner.
unsafe impl Sync for CqInner {}
impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_cq; QPs on it hold an Arc of this, so they are gone.
        unsafe { ibv_destroy_cq(self.raw) };
    }
}

/// A completion queue.
pub struct IbCq(Arc<CqInner>);

/// A queue pair.
pub struct IbQp {
    raw: *mut ibv_qp,
    qp_type: QpType,
    _pd: Arc<PdInner>,
    _cq: Arc<CqInner>,
}
// SAFETY: see CtxInner.
unsafe impl Send for IbQp {}
impl Drop for IbQp {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_qp, destroyed once.
        unsafe { ibv_destroy_qp(self.raw) };
    }
}

/// A registered memory region; deregisters before its memory is freed.
pub struct IbMr {
    raw: *mut ibv_mr,
    region: Region,
    _pd: Arc<PdInner>,
}
// SAFETY: see CtxInner; the Region is uniquely owned.
unsafe impl Send for IbMr {}
impl Drop for IbMr {
    fn drop(&mut self) {
        // SAFETY: from ibv_reg_mr; runs before `region` (a field) is freed.
        unsafe { ibv_dereg_mr(self.raw) };
    }
}

impl MemoryRegion for IbMr {
    fn region(&self) -> &Region {
        &self.region
    }
    fn region_mut(&mut self) -> &mut Region {
        &mut self.region
    }
}

impl IbMr {
    fn lkey(&self) -> u32 {
        // SAFETY: raw is a live ibv_mr.
        unsafe { (*self.raw).lkey }
    }

    fn sge(&self, offset: usize, len: usize) -> Result<ibv_sge, VerbsError> {
        self.region.check_range(offset, len)?;
        let length = u32::try_from(len)
            .map_err(|_| VerbsError::Invalid(format!("{len} bytes in one work request")))?;
        Ok(ibv_sge {
            addr: self.region.as_ptr() as u64 + offset as u64,
            length,
            lkey: self.lkey(),
        })
    }
}

fn modify(
    qp: &mut IbQp,
    attr: &mut ibv_qp_attr,
    mask: ibv_qp_attr_mask,
    op: &'static str,
) -> Result<(), VerbsError> {
    // SAFETY: qp is live; attr is a fully initialised ibv_qp_attr for the duration of the call.
    let rc = unsafe { ibv_modify_qp(qp.raw, attr, mask.0 as c_int) };
    if rc != 0 {
        return Err(call(op, rc));
    }
    Ok(())
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is a C struct of integers and unions of integers; all-zero is valid
    // (and is how C callers initialise it).
    unsafe { std::mem::zeroed() }
}

impl Verbs for IbVerbs {
    type Context = IbContext;
    type Pd = IbPd;
    type Cq = IbCq;
    type Qp = IbQp;
    type Mr = IbMr;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn device_names(&self) -> Result<Vec<String>, VerbsError> {
        Ok(DeviceList::get()?.devices().map(|(_, n)| n).collect())
    }

    fn open(&self, name: &str) -> Result<IbContext, VerbsError> {
        let list = DeviceList::get()?;
        let mut available = Vec::new();
        for (dev, n) in list.devices() {
            if n == name {
                // SAFETY: dev is a live device of the list.
                let ctx = unsafe { ibv_open_device(dev) };
                if ctx.is_null() {
                    return Err(null("ibv_open_device"));
                }
                return Ok(IbContext(Arc::new(CtxInner(ctx))));
            }
            available.push(n);
        }
        Err(VerbsError::DeviceNotFound {
            provider: PROVIDER,
            name: name.to_string(),
            available,
        })
    }

    fn alloc_pd(&self, ctx: &IbContext) -> Result<IbPd, VerbsError> {
        // SAFETY: ctx is live.
        let pd = unsafe { ibv_alloc_pd(ctx.0.0) };
        if pd.is_null() {
            return Err(null("ibv_alloc_pd"));
        }
        Ok(IbPd(Arc::new(PdInner {
            raw: pd,
            _ctx: Arc::clone(&ctx.0),
        })))
    }

    fn create_cq(&self, ctx: &IbContext, depth: u32) -> Result<IbCq, VerbsError> {
        let cqe =
            c_int::try_from(depth).map_err(|_| VerbsError::Invalid(format!("CQ depth {depth}")))?;
        // SAFETY: ctx is live; no channel, no context pointer.
        let cq =
            unsafe { ibv_create_cq(ctx.0.0, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(null("ibv_create_cq"));
        }
        Ok(IbCq(Arc::new(CqInner {
            raw: cq,
            _ctx: Arc::clone(&ctx.0),
        })))
    }

    fn create_qp(
        &self,
        pd: &IbPd,
        cq: &IbCq,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<IbQp, VerbsError> {
        // SAFETY: all-zero is a valid ibv_qp_init_attr (null pointers, zero caps).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.0.raw;
        init.recv_cq = cq.0.raw;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = caps.max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = match qp_type {
            QpType::Uc => ibv_qp_type::IBV_QPT_UC,
            QpType::Rc => ibv_qp_type::IBV_QPT_RC,
        };
        // SAFETY: pd and cq are live; init is initialised.
        let qp = unsafe { ibv_create_qp(pd.0.raw, &mut init) };
        if qp.is_null() {
            return Err(null(match qp_type {
                QpType::Uc => "ibv_create_qp(UC)",
                QpType::Rc => "ibv_create_qp(RC)",
            }));
        }
        Ok(IbQp {
            raw: qp,
            qp_type,
            _pd: Arc::clone(&pd.0),
            _cq: Arc::clone(&cq.0),
        })
    }

    fn qp_num(&self, qp: &IbQp) -> u32 {
        // SAFETY: qp is live.
        unsafe { (*qp.raw).qp_num }
    }

    fn query_port(&self, ctx: &IbContext, port: u8) -> Result<PortInfo, VerbsError> {
        // SAFETY: all-zero is a valid ibv_port_attr.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is live; attr is a valid out-pointer.
        let rc = unsafe { ___ibv_query_port(ctx.0.0, port, &mut attr) };
        if rc != 0 {
            return Err(call("ibv_query_port", rc));
        }
        Ok(PortInfo {
            lid: attr.lid,
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            active_mtu: mtu_bytes(attr.active_mtu),
            active: attr.state == ibv_port_state::IBV_PORT_ACTIVE,
        })
    }

    fn query_gid(&self, ctx: &IbContext, port: u8, index: u32) -> Result<Gid, VerbsError> {
        let index = c_int::try_from(index)
            .map_err(|_| VerbsError::Invalid(format!("GID index {index}")))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: ctx is live; gid is a valid out-pointer.
        let rc = unsafe { ibv_query_gid(ctx.0.0, port, index, &mut gid) };
        if rc != 0 {
            return Err(call("ibv_query_gid", rc));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }

    fn modify_to_init(&self, qp: &mut IbQp, port: u8) -> Result<(), VerbsError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.port_num = port;
        attr.pkey_index = 0;
        attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        modify(qp, &mut attr, mask, "ibv_modify_qp(INIT)")
    }

    fn modify_to_rtr(
        &self,
        qp: &mut IbQp,
        remote: &QpEndpoint,
        path: &PathParams,
    ) -> Result<(), VerbsError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = match mtu_code(path.mtu)? {
            1 => ibv_mtu::IBV_MTU_256,
            2 => ibv_mtu::IBV_MTU_512,
            3 => ibv_mtu::IBV_MTU_1024,
            4 => ibv_mtu::IBV_MTU_2048,
            _ => ibv_mtu::IBV_MTU_4096,
        };
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.port_num = path.port;
        if remote.gid != [0; 16] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.hop_limit = 1;
            attr.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = path.sgid_index;
        }
        let mut mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN;
        if qp.qp_type == QpType::Rc {
            attr.max_dest_rd_atomic = 1;
            attr.min_rnr_timer = 12;
            mask = mask
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        }
        modify(qp, &mut attr, mask, "ibv_modify_qp(RTR)")
    }

    fn modify_to_rts(&self, qp: &mut IbQp, psn: u32) -> Result<(), VerbsError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = psn;
        let mut mask = ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN;
        if qp.qp_type == QpType::Rc {
            attr.timeout = 14;
            attr.retry_cnt = 7;
            attr.rnr_retry = 7;
            attr.max_rd_atomic = 1;
            mask = mask
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        }
        modify(qp, &mut attr, mask, "ibv_modify_qp(RTS)")
    }

    fn reg_mr(&self, pd: &IbPd, region: Region) -> Result<IbMr, VerbsError> {
        // SAFETY: the region is a live allocation of `len` bytes that the returned IbMr owns
        // and frees only after ibv_dereg_mr.
        let mr = unsafe {
            ibv_reg_mr(
                pd.0.raw,
                region.as_ptr() as *mut c_void,
                region.len(),
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int,
            )
        };
        if mr.is_null() {
            return Err(null("ibv_reg_mr"));
        }
        Ok(IbMr {
            raw: mr,
            region,
            _pd: Arc::clone(&pd.0),
        })
    }

    fn post_send(
        &self,
        qp: &mut IbQp,
        mr: &IbMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let mut sge = mr.sge(offset, len)?;
        // SAFETY: all-zero is a valid ibv_send_wr (null next, no unions in use).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: qp is live; wr and sge live across the call (the provider copies them); the
        // SGE names registered memory that stays untouched until the completion (transport).
        let rc = unsafe { ibv_post_send(qp.raw, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(call("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(
        &self,
        qp: &mut IbQp,
        mr: &IbMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let mut sge = mr.sge(offset, len)?;
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as in post_send.
        let rc = unsafe { ibv_post_recv(qp.raw, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(call("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn poll_cq(
        &self,
        cq: &mut IbCq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        let max = max.min(64);
        let mut wcs: Vec<ibv_wc> = Vec::with_capacity(max);
        // SAFETY: cq is live; wcs has room for `max` entries.
        let n = unsafe { ibv_poll_cq(cq.0.raw, max as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::Call {
                op: "ibv_poll_cq",
                detail: format!("returned {n} (completion queue error or overrun)"),
            });
        }
        let n = n as usize;
        // SAFETY: ibv_poll_cq initialised the first n entries.
        unsafe { wcs.set_len(n) };
        out.extend(wcs.iter().map(|wc| WorkCompletion {
            wr_id: wc.wr_id,
            status: match wc.status {
                ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
                ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
                ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
                ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::ReceiverNotReady,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
                ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
                other => WcStatus::Other(other),
            },
            // Only meaningful on success (verbs leaves it undefined on errors).
            opcode: if wc.opcode & ibv_wc_opcode::IBV_WC_RECV != 0 {
                WcOpcode::Recv
            } else {
                WcOpcode::Send
            },
            byte_len: wc.byte_len,
        }));
        Ok(n)
    }
}

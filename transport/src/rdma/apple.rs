//! The [`Verbs`] provider over Apple's verbs-compatible `librdma.dylib` (macOS 26.2+,
//! Thunderbolt 5), feature `rdma`. As JACCL does, the library is dlopened at run time and its
//! exported `ibv_*` functions are looked up by name; everything that touches a struct laid out
//! by Apple's `<infiniband/verbs.h>` — QP creation and state changes, port attributes, the
//! header-inline `ibv_post_send` / `ibv_post_recv` / `ibv_poll_cq` — goes through the C shim
//! `apple_shim.c`, which build.rs compiles only when the SDK has that header
//! (`cfg(tb_apple_shim)`). Without it [`AppleVerbs::load`] reports Unsupported, and tb uses TCP.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;

use super::verbs::{
    Gid, MemoryRegion, PathParams, PortInfo, QpCaps, QpEndpoint, QpType, Region, Verbs, VerbsError,
    WcOpcode, WcStatus, WorkCompletion, mtu_bytes, mtu_code,
};

const PROVIDER: &str = "librdma";

type Ptr = *mut c_void;
type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut Ptr;
type FreeDeviceListFn = unsafe extern "C" fn(*mut Ptr);
type GetDeviceNameFn = unsafe extern "C" fn(Ptr) -> *const c_char;
type OpenDeviceFn = unsafe extern "C" fn(Ptr) -> Ptr;
type CloseFn = unsafe extern "C" fn(Ptr) -> c_int;
type AllocPdFn = unsafe extern "C" fn(Ptr) -> Ptr;
type CreateCqFn = unsafe extern "C" fn(Ptr, c_int, Ptr, Ptr, c_int) -> Ptr;

/// The C shim's view of a completion (see apple_shim.c).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TbWc {
    wr_id: u64,
    status: u32,
    is_recv: u32,
    byte_len: u32,
}

/// The C shim's view of port attributes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TbPort {
    lid: u16,
    gid_tbl_len: u32,
    active_mtu: u32,
    active: u32,
}

#[cfg(tb_apple_shim)]
mod shim {
    use super::{Ptr, TbPort, TbWc};
    use std::os::raw::c_int;

    unsafe extern "C" {
        pub fn tb_rdma_create_qp(
            create_qp: Ptr,
            pd: Ptr,
            cq: Ptr,
            uc: c_int,
            max_send_wr: u32,
            max_recv_wr: u32,
        ) -> Ptr;
        pub fn tb_rdma_qp_num(qp: Ptr) -> u32;
        pub fn tb_rdma_query_port(query_port: Ptr, ctx: Ptr, port: u8, out: *mut TbPort) -> c_int;
        pub fn tb_rdma_query_gid(
            query_gid: Ptr,
            ctx: Ptr,
            port: u8,
            index: c_int,
            out: *mut u8,
        ) -> c_int;
        pub fn tb_rdma_modify_init(modify_qp: Ptr, qp: Ptr, port: u8) -> c_int;
        pub fn tb_rdma_modify_rtr(
            modify_qp: Ptr,
            qp: Ptr,
            dest_qpn: u32,
            rq_psn: u32,
            dlid: u16,
            gid: *const u8,
            use_gid: c_int,
            sgid_index: u8,
            port: u8,
            mtu: u32,
            rc_qp: c_int,
        ) -> c_int;
        pub fn tb_rdma_modify_rts(modify_qp: Ptr, qp: Ptr, sq_psn: u32, rc_qp: c_int) -> c_int;
        pub fn tb_rdma_reg_mr(reg_mr: Ptr, pd: Ptr, addr: Ptr, len: usize, lkey: *mut u32) -> Ptr;
        pub fn tb_rdma_post_send(qp: Ptr, addr: u64, len: u32, lkey: u32, wr_id: u64) -> c_int;
        pub fn tb_rdma_post_recv(qp: Ptr, addr: u64, len: u32, lkey: u32, wr_id: u64) -> c_int;
        pub fn tb_rdma_poll_cq(cq: Ptr, max: c_int, out: *mut TbWc) -> c_int;
    }
}

/// Without the SDK header there is no shim: these stand-ins are never reached, because
/// [`AppleVerbs::load`] refuses first.
#[cfg(not(tb_apple_shim))]
#[allow(clippy::too_many_arguments, clippy::missing_safety_doc)]
mod shim {
    use super::{Ptr, TbPort, TbWc};
    use std::os::raw::c_int;

    const ENOSYS: c_int = 78;
    pub unsafe fn tb_rdma_create_qp(_: Ptr, _: Ptr, _: Ptr, _: c_int, _: u32, _: u32) -> Ptr {
        std::ptr::null_mut()
    }
    pub unsafe fn tb_rdma_qp_num(_: Ptr) -> u32 {
        0
    }
    pub unsafe fn tb_rdma_query_port(_: Ptr, _: Ptr, _: u8, _: *mut TbPort) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_query_gid(_: Ptr, _: Ptr, _: u8, _: c_int, _: *mut u8) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_modify_init(_: Ptr, _: Ptr, _: u8) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_modify_rtr(
        _: Ptr,
        _: Ptr,
        _: u32,
        _: u32,
        _: u16,
        _: *const u8,
        _: c_int,
        _: u8,
        _: u8,
        _: u32,
        _: c_int,
    ) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_modify_rts(_: Ptr, _: Ptr, _: u32, _: c_int) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_reg_mr(_: Ptr, _: Ptr, _: Ptr, _: usize, _: *mut u32) -> Ptr {
        std::ptr::null_mut()
    }
    pub unsafe fn tb_rdma_post_send(_: Ptr, _: u64, _: u32, _: u32, _: u64) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_post_recv(_: Ptr, _: u64, _: u32, _: u32, _: u64) -> c_int {
        ENOSYS
    }
    pub unsafe fn tb_rdma_poll_cq(_: Ptr, _: c_int, _: *mut TbWc) -> c_int {
        -1
    }
}

/// librdma, loaded, with the entry points tb uses.
struct Lib {
    get_device_list: GetDeviceListFn,
    free_device_list: FreeDeviceListFn,
    get_device_name: GetDeviceNameFn,
    open_device: OpenDeviceFn,
    close_device: CloseFn,
    alloc_pd: AllocPdFn,
    dealloc_pd: CloseFn,
    create_cq: CreateCqFn,
    destroy_cq: CloseFn,
    destroy_qp: CloseFn,
    dereg_mr: CloseFn,
    // Passed to the shim, which knows their struct arguments.
    create_qp: Ptr,
    modify_qp: Ptr,
    query_port: Ptr,
    query_gid: Ptr,
    reg_mr: Ptr,
    // Last: the function pointers above are valid while the library stays loaded.
    _lib: libloading::Library,
}

// SAFETY: the library handle and function pointers are immutable after load and librdma's
// functions may be called from any thread (JACCL calls them from several).
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, VerbsError> {
    // SAFETY: T is the C signature of `name` as declared by Apple's verbs.h (checked by hand
    // against JACCL's IBVWrapper); the pointer is used only while `lib` is loaded (Lib keeps it).
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| VerbsError::Unsupported(format!("librdma.dylib has no {name}: {e}")))
    }
}

fn raw_sym(lib: &libloading::Library, name: &str) -> Result<Ptr, VerbsError> {
    // SAFETY: only the address is taken; the shim calls it with the header's signature.
    unsafe {
        lib.get::<*mut c_void>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| VerbsError::Unsupported(format!("librdma.dylib has no {name}: {e}")))
    }
}

fn call(op: &'static str, rc: c_int) -> VerbsError {
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

/// The librdma provider.
#[derive(Clone)]
pub struct AppleVerbs {
    lib: Arc<Lib>,
}

impl AppleVerbs {
    /// Loads `librdma.dylib` (Unsupported when it is missing, too old, or tb was built without
    /// the SDK's verbs header).
    pub fn load() -> Result<Self, VerbsError> {
        if !cfg!(tb_apple_shim) {
            return Err(VerbsError::Unsupported(
                "this tb-nodelet was built without the macOS SDK's infiniband/verbs.h (SDK 26.2+), \
                 so it cannot drive librdma"
                    .into(),
            ));
        }
        // SAFETY: loading a system library runs its initialisers; librdma is Apple's, the
        // same one JACCL loads.
        let lib = unsafe { libloading::Library::new("librdma.dylib") }.map_err(|e| {
            VerbsError::NoDevice {
                provider: PROVIDER,
                detail: format!(
                    "cannot load librdma.dylib (needs macOS 26.2+ with RDMA over Thunderbolt): {e}"
                ),
            }
        })?;
        Ok(AppleVerbs {
            lib: Arc::new(Lib {
                get_device_list: sym(&lib, "ibv_get_device_list")?,
                free_device_list: sym(&lib, "ibv_free_device_list")?,
                get_device_name: sym(&lib, "ibv_get_device_name")?,
                open_device: sym(&lib, "ibv_open_device")?,
                close_device: sym(&lib, "ibv_close_device")?,
                alloc_pd: sym(&lib, "ibv_alloc_pd")?,
                dealloc_pd: sym(&lib, "ibv_dealloc_pd")?,
                create_cq: sym(&lib, "ibv_create_cq")?,
                destroy_cq: sym(&lib, "ibv_destroy_cq")?,
                destroy_qp: sym(&lib, "ibv_destroy_qp")?,
                dereg_mr: sym(&lib, "ibv_dereg_mr")?,
                create_qp: raw_sym(&lib, "ibv_create_qp")?,
                modify_qp: raw_sym(&lib, "ibv_modify_qp")?,
                query_port: raw_sym(&lib, "ibv_query_port")?,
                query_gid: raw_sym(&lib, "ibv_query_gid")?,
                reg_mr: raw_sym(&lib, "ibv_reg_mr")?,
                _lib: lib,
            }),
        })
    }

    /// Device names and handles; the list is freed before returning, so only names leave.
    fn with_devices<T>(
        &self,
        f: impl FnOnce(&[(Ptr, String)]) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; the list is freed below.
        let list = unsafe { (self.lib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(VerbsError::NoDevice {
                provider: PROVIDER,
                detail: format!("ibv_get_device_list: {}", std::io::Error::last_os_error()),
            });
        }
        let devices: Vec<(Ptr, String)> = (0..usize::try_from(n).unwrap_or(0))
            .map(|i| {
                // SAFETY: the list holds n device pointers.
                let dev = unsafe { *list.add(i) };
                // SAFETY: a NUL-terminated name owned by the device.
                let name = unsafe { CStr::from_ptr((self.lib.get_device_name)(dev)) }
                    .to_string_lossy()
                    .into_owned();
                (dev, name)
            })
            .collect();
        let result = if devices.is_empty() {
            Err(VerbsError::NoDevice {
                provider: PROVIDER,
                detail: "no Thunderbolt RDMA device (is RDMA enabled with rdma_ctl?)".into(),
            })
        } else {
            f(&devices)
        };
        // SAFETY: from get_device_list, freed once; opened contexts stay valid.
        unsafe { (self.lib.free_device_list)(list) };
        result
    }
}

struct Handle {
    raw: Ptr,
    destroy: CloseFn,
    parents: Vec<Arc<Handle>>,
    _lib: Arc<Lib>,
}
// SAFETY: verbs objects may be used from any thread; each is owned by one handle.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}
impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: raw came from the matching create call and is destroyed once, before its
        // parents (dropped after this, as fields).
        unsafe { (self.destroy)(self.raw) };
        self.parents.clear();
    }
}

/// An open device.
pub struct AppleContext(Arc<Handle>);
/// A protection domain.
pub struct ApplePd(Arc<Handle>);
/// A completion queue.
pub struct AppleCq(Arc<Handle>);
/// A queue pair.
pub struct AppleQp {
    handle: Handle,
    qp_type: QpType,
}
/// A registered memory region (deregistered before its memory is freed).
pub struct AppleMr {
    _handle: Handle,
    lkey: u32,
    region: Region,
}

impl MemoryRegion for AppleMr {
    fn region(&self) -> &Region {
        &self.region
    }
    fn region_mut(&mut self) -> &mut Region {
        &mut self.region
    }
}

impl AppleMr {
    fn sge(&self, offset: usize, len: usize) -> Result<(u64, u32), VerbsError> {
        self.region.check_range(offset, len)?;
        let len = u32::try_from(len)
            .map_err(|_| VerbsError::Invalid(format!("{len} bytes in one work request")))?;
        Ok((self.region.as_ptr() as u64 + offset as u64, len))
    }
}

impl Verbs for AppleVerbs {
    type Context = AppleContext;
    type Pd = ApplePd;
    type Cq = AppleCq;
    type Qp = AppleQp;
    type Mr = AppleMr;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn device_names(&self) -> Result<Vec<String>, VerbsError> {
        self.with_devices(|d| Ok(d.iter().map(|(_, n)| n.clone()).collect()))
    }

    fn open(&self, name: &str) -> Result<AppleContext, VerbsError> {
        self.with_devices(|devices| {
            let Some((dev, _)) = devices.iter().find(|(_, n)| n == name) else {
                return Err(VerbsError::DeviceNotFound {
                    provider: PROVIDER,
                    name: name.to_string(),
                    available: devices.iter().map(|(_, n)| n.clone()).collect(),
                });
            };
            // SAFETY: dev is a live device of the list.
            let ctx = unsafe { (self.lib.open_device)(*dev) };
            if ctx.is_null() {
                return Err(null("ibv_open_device"));
            }
            Ok(AppleContext(Arc::new(Handle {
                raw: ctx,
                destroy: self.lib.close_device,
                parents: Vec::new(),
                _lib: Arc::clone(&self.lib),
            })))
        })
    }

    fn alloc_pd(&self, ctx: &AppleContext) -> Result<ApplePd, VerbsError> {
        // SAFETY: ctx is live.
        let pd = unsafe { (self.lib.alloc_pd)(ctx.0.raw) };
        if pd.is_null() {
            return Err(null("ibv_alloc_pd"));
        }
        Ok(ApplePd(Arc::new(Handle {
            raw: pd,
            destroy: self.lib.dealloc_pd,
            parents: vec![Arc::clone(&ctx.0)],
            _lib: Arc::clone(&self.lib),
        })))
    }

    fn create_cq(&self, ctx: &AppleContext, depth: u32) -> Result<AppleCq, VerbsError> {
        let cqe =
            c_int::try_from(depth).map_err(|_| VerbsError::Invalid(format!("CQ depth {depth}")))?;
        // SAFETY: ctx is live; no channel.
        let cq = unsafe {
            (self.lib.create_cq)(
                ctx.0.raw,
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(null("ibv_create_cq"));
        }
        Ok(AppleCq(Arc::new(Handle {
            raw: cq,
            destroy: self.lib.destroy_cq,
            parents: vec![Arc::clone(&ctx.0)],
            _lib: Arc::clone(&self.lib),
        })))
    }

    fn create_qp(
        &self,
        pd: &ApplePd,
        cq: &AppleCq,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<AppleQp, VerbsError> {
        let uc = c_int::from(qp_type == QpType::Uc);
        // SAFETY: pd and cq are live; the shim builds ibv_qp_init_attr with Apple's layout.
        let qp = unsafe {
            shim::tb_rdma_create_qp(
                self.lib.create_qp,
                pd.0.raw,
                cq.0.raw,
                uc,
                caps.max_send_wr,
                caps.max_recv_wr,
            )
        };
        if qp.is_null() {
            return Err(null(match qp_type {
                QpType::Uc => "ibv_create_qp(UC)",
                QpType::Rc => "ibv_create_qp(RC)",
            }));
        }
        Ok(AppleQp {
            handle: Handle {
                raw: qp,
                destroy: self.lib.destroy_qp,
                parents: vec![Arc::clone(&pd.0), Arc::clone(&cq.0)],
                _lib: Arc::clone(&self.lib),
            },
            qp_type,
        })
    }

    fn qp_num(&self, qp: &AppleQp) -> u32 {
        // SAFETY: qp is live.
        unsafe { shim::tb_rdma_qp_num(qp.handle.raw) }
    }

    fn query_port(&self, ctx: &AppleContext, port: u8) -> Result<PortInfo, VerbsError> {
        let mut out = TbPort::default();
        // SAFETY: ctx is live; out is a valid out-pointer.
        let rc =
            unsafe { shim::tb_rdma_query_port(self.lib.query_port, ctx.0.raw, port, &mut out) };
        if rc != 0 {
            return Err(call("ibv_query_port", rc));
        }
        Ok(PortInfo {
            lid: out.lid,
            gid_table_len: out.gid_tbl_len,
            active_mtu: mtu_bytes(out.active_mtu),
            active: out.active != 0,
        })
    }

    fn query_gid(&self, ctx: &AppleContext, port: u8, index: u32) -> Result<Gid, VerbsError> {
        let index = c_int::try_from(index)
            .map_err(|_| VerbsError::Invalid(format!("GID index {index}")))?;
        let mut gid = [0u8; 16];
        // SAFETY: ctx is live; gid has the 16 bytes the shim writes.
        let rc = unsafe {
            shim::tb_rdma_query_gid(self.lib.query_gid, ctx.0.raw, port, index, gid.as_mut_ptr())
        };
        if rc != 0 {
            return Err(call("ibv_query_gid", rc));
        }
        Ok(gid)
    }

    fn modify_to_init(&self, qp: &mut AppleQp, port: u8) -> Result<(), VerbsError> {
        // SAFETY: qp is live.
        let rc = unsafe { shim::tb_rdma_modify_init(self.lib.modify_qp, qp.handle.raw, port) };
        if rc != 0 {
            return Err(call("ibv_modify_qp(INIT)", rc));
        }
        Ok(())
    }

    fn modify_to_rtr(
        &self,
        qp: &mut AppleQp,
        remote: &QpEndpoint,
        path: &PathParams,
    ) -> Result<(), VerbsError> {
        let mtu = mtu_code(path.mtu)?;
        let use_gid = c_int::from(remote.gid != [0; 16]);
        // SAFETY: qp is live; the gid pointer is valid for 16 bytes during the call.
        let rc = unsafe {
            shim::tb_rdma_modify_rtr(
                self.lib.modify_qp,
                qp.handle.raw,
                remote.qpn,
                remote.psn,
                remote.lid,
                remote.gid.as_ptr(),
                use_gid,
                path.sgid_index,
                path.port,
                mtu,
                c_int::from(qp.qp_type == QpType::Rc),
            )
        };
        if rc != 0 {
            // Apple: an RC queue pair fails here with ENOTSUP.
            return Err(call("ibv_modify_qp(RTR)", rc));
        }
        Ok(())
    }

    fn modify_to_rts(&self, qp: &mut AppleQp, psn: u32) -> Result<(), VerbsError> {
        // SAFETY: qp is live.
        let rc = unsafe {
            shim::tb_rdma_modify_rts(
                self.lib.modify_qp,
                qp.handle.raw,
                psn,
                c_int::from(qp.qp_type == QpType::Rc),
            )
        };
        if rc != 0 {
            return Err(call("ibv_modify_qp(RTS)", rc));
        }
        Ok(())
    }

    fn reg_mr(&self, pd: &ApplePd, region: Region) -> Result<AppleMr, VerbsError> {
        let mut lkey = 0u32;
        // SAFETY: the region is a live allocation owned by the returned AppleMr, which
        // deregisters before freeing it.
        let mr = unsafe {
            shim::tb_rdma_reg_mr(
                self.lib.reg_mr,
                pd.0.raw,
                region.as_ptr() as Ptr,
                region.len(),
                &mut lkey,
            )
        };
        if mr.is_null() {
            return Err(null("ibv_reg_mr"));
        }
        Ok(AppleMr {
            _handle: Handle {
                raw: mr,
                destroy: self.lib.dereg_mr,
                parents: vec![Arc::clone(&pd.0)],
                _lib: Arc::clone(&self.lib),
            },
            lkey,
            region,
        })
    }

    fn post_send(
        &self,
        qp: &mut AppleQp,
        mr: &AppleMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let (addr, len) = mr.sge(offset, len)?;
        // SAFETY: qp is live; the range is inside registered memory that the transport leaves
        // alone until the completion.
        let rc = unsafe { shim::tb_rdma_post_send(qp.handle.raw, addr, len, mr.lkey, wr_id) };
        if rc != 0 {
            return Err(call("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(
        &self,
        qp: &mut AppleQp,
        mr: &AppleMr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let (addr, len) = mr.sge(offset, len)?;
        // SAFETY: as in post_send.
        let rc = unsafe { shim::tb_rdma_post_recv(qp.handle.raw, addr, len, mr.lkey, wr_id) };
        if rc != 0 {
            return Err(call("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn poll_cq(
        &self,
        cq: &mut AppleCq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        let mut wcs = [TbWc::default(); 64];
        let max = max.min(wcs.len());
        // SAFETY: cq is live; wcs has room for `max` entries.
        let n = unsafe { shim::tb_rdma_poll_cq(cq.0.raw, max as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::Call {
                op: "ibv_poll_cq",
                detail: format!("returned {n}"),
            });
        }
        let n = (n as usize).min(max);
        out.extend(wcs[..n].iter().map(|wc| WorkCompletion {
            wr_id: wc.wr_id,
            status: match wc.status {
                0 => WcStatus::Success,
                1 => WcStatus::LocalLength,
                2 => WcStatus::Flushed,
                3 => WcStatus::ReceiverNotReady,
                4 => WcStatus::RemoteInvalidRequest,
                5 => WcStatus::RetryExceeded,
                other => WcStatus::Other(other.saturating_sub(1000)),
            },
            opcode: if wc.is_recv != 0 {
                WcOpcode::Recv
            } else {
                WcOpcode::Send
            },
            byte_len: wc.byte_len,
        }));
        Ok(n)
    }
}

//! The RDMA transport: [`RdmaTransport`] over a [`Verbs`] provider.
//!
//! - [`verbs`]: the verbs surface tb uses, as a trait, and registered memory.
//! - [`transport`]: the [`Transport`] implementation: bounce buffers, credits, chunking; its
//!   set-up lives in `connect`, the per-peer protocol in `link`, settings in [`config`].
//! - [`header`], [`qpinfo`]: the per-SEND header and the queue-pair info blob of the bootstrap.
//! - `ibverbs` (Linux, feature `rdma`): rdma-core's libibverbs through `rdma-sys`.
//! - `apple` (macOS, feature `rdma`): Apple's `librdma.dylib`, loaded at run time.
//!
//! The generic parts build without the feature and are tested against
//! [`crate::transport::verbs_sim`]; only the real providers and [`open`] need `rdma`.

pub mod config;
mod connect;
pub mod header;
mod link;
pub mod qpinfo;
pub mod transport;
pub mod verbs;

#[cfg(all(feature = "rdma", target_os = "macos"))]
pub mod apple;
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub mod ibverbs;

#[cfg(test)]
mod tests;

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

pub use transport::{RdmaConfig, RdmaStats, RdmaTransport};
pub use verbs::{Verbs, VerbsError};

#[cfg(feature = "rdma")]
use super::{Endpoints, Transport};
use super::{TransportError, bootstrap};

/// Environment variable naming the device of each link: a JSON list with one entry per rank,
/// a device name or `null` (one row of MLX's `MLX_IBV_DEVICES` matrix), e.g.
/// `[null, "rdma_en2", "rdma_en3"]` for rank 0 of 3.
pub const DEVICES_ENV: &str = "TB_RDMA_DEVICES";

/// Parses [`DEVICES_ENV`]'s value for a world of `world` ranks.
pub fn parse_devices(value: &str, world: usize) -> Result<Vec<Option<String>>, TransportError> {
    let devices: Vec<Option<String>> = serde_json::from_str(value).map_err(|e| {
        TransportError::Invalid(format!(
            "{DEVICES_ENV}: expected a JSON list of device names or null, one per rank: {e}"
        ))
    })?;
    if devices.len() != world {
        return Err(TransportError::Invalid(format!(
            "{DEVICES_ENV}: {} entries for a world of {world}",
            devices.len()
        )));
    }
    Ok(devices)
}

/// The devices to use with `verbs` when nothing names them: the only device for every peer.
/// Several devices (a Mac with several Thunderbolt ports) need [`DEVICES_ENV`].
pub fn default_devices<V: Verbs>(
    verbs: &V,
    rank: usize,
    world: usize,
) -> Result<Vec<Option<String>>, TransportError> {
    let names = verbs
        .device_names()
        .map_err(|e| TransportError::Unsupported(e.to_string()))?;
    match names.as_slice() {
        [] => Err(TransportError::Unsupported(format!(
            "{}: no RDMA device",
            verbs.provider()
        ))),
        [only] => Ok((0..world)
            .map(|p| (p != rank).then(|| only.clone()))
            .collect()),
        several => Err(TransportError::Unsupported(format!(
            "{}: several RDMA devices ({}); set {DEVICES_ENV} to say which one reaches each rank",
            verbs.provider(),
            several.join(", ")
        ))),
    }
}

/// A bootstrap exchange over the coordinator: rank 0 binds `coordinator` on first use (so a
/// failed device set-up never touches the network) and serves every round from that listener.
pub fn coordinator_exchange(
    coordinator: SocketAddr,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> impl FnMut(&[u8]) -> Result<Vec<Vec<u8>>, TransportError> {
    let mut listener: Option<TcpListener> = None;
    move |blob: &[u8]| {
        if rank != 0 {
            return bootstrap::all_gather(coordinator, rank, world, blob, timeout);
        }
        if listener.is_none() {
            listener = Some(TcpListener::bind(coordinator).map_err(|e| {
                TransportError::Bootstrap(format!(
                    "rank 0 cannot listen on coordinator {coordinator}: {e}"
                ))
            })?);
        }
        let l = listener
            .as_ref()
            .ok_or_else(|| TransportError::Bootstrap("coordinator listener missing".into()))?
            .try_clone()
            .map_err(|e| TransportError::Bootstrap(format!("coordinator socket: {e}")))?;
        bootstrap::serve(l, world, blob, timeout)
    }
}

/// Opens the RDMA transport with provider `verbs`: `devices[p]` is the device of the link to
/// rank `p` (`None`: no link), the queue-pair info goes through the bootstrap at `coordinator`.
pub fn open_with<V: Verbs>(
    verbs: V,
    rank: usize,
    world: usize,
    devices: &[Option<String>],
    coordinator: SocketAddr,
    cfg: RdmaConfig,
) -> Result<RdmaTransport<V>, TransportError> {
    let mut exchange = coordinator_exchange(coordinator, rank, world, cfg.connect_timeout);
    RdmaTransport::connect(verbs, rank, world, devices, cfg, &mut exchange)
}

/// Opens the RDMA transport on this machine's provider (libibverbs on Linux, Apple's librdma
/// on macOS): `device_names[p]` names the device of the link to rank `p`. Fails with
/// [`TransportError::Unsupported`] when there is no provider or device, so that callers fall
/// back to TCP.
#[cfg(feature = "rdma")]
pub fn open_devices(
    rank: usize,
    world: usize,
    device_names: &[Option<String>],
    coordinator: SocketAddr,
    timeout: Duration,
) -> Result<Box<dyn Transport>, TransportError> {
    let cfg = RdmaConfig {
        connect_timeout: timeout,
        ..RdmaConfig::default()
    };
    open_native(rank, world, Some(device_names), coordinator, cfg)
}

/// The hook of [`crate::transport::select`]: [`open_devices`] with the devices from
/// [`DEVICES_ENV`], else the machine's only device for every peer.
#[cfg(feature = "rdma")]
pub fn open(ep: &Endpoints) -> Result<Box<dyn Transport>, TransportError> {
    let devices = match std::env::var(DEVICES_ENV) {
        Ok(v) => Some(parse_devices(&v, ep.world)?),
        Err(_) => None,
    };
    let cfg = RdmaConfig {
        connect_timeout: ep.connect_timeout,
        ..RdmaConfig::default()
    };
    open_native(ep.rank, ep.world, devices.as_deref(), ep.coordinator, cfg)
}

#[cfg(all(feature = "rdma", target_os = "linux"))]
fn open_native(
    rank: usize,
    world: usize,
    devices: Option<&[Option<String>]>,
    coordinator: SocketAddr,
    cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let verbs = ibverbs::IbVerbs;
    let devices = match devices {
        Some(d) => d.to_vec(),
        None => default_devices(&verbs, rank, world)?,
    };
    Ok(Box::new(open_with(
        verbs,
        rank,
        world,
        &devices,
        coordinator,
        cfg,
    )?))
}

#[cfg(all(feature = "rdma", target_os = "macos"))]
fn open_native(
    rank: usize,
    world: usize,
    devices: Option<&[Option<String>]>,
    coordinator: SocketAddr,
    cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let verbs =
        apple::AppleVerbs::load().map_err(|e| TransportError::Unsupported(e.to_string()))?;
    let devices = match devices {
        Some(d) => d.to_vec(),
        None => default_devices(&verbs, rank, world)?,
    };
    Ok(Box::new(open_with(
        verbs,
        rank,
        world,
        &devices,
        coordinator,
        cfg,
    )?))
}

#[cfg(all(feature = "rdma", not(any(target_os = "linux", target_os = "macos"))))]
fn open_native(
    _rank: usize,
    _world: usize,
    _devices: Option<&[Option<String>]>,
    _coordinator: SocketAddr,
    _cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    Err(TransportError::Unsupported(
        "RDMA verbs are supported on Linux (libibverbs) and macOS (librdma) only".into(),
    ))
}

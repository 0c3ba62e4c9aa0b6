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
//! [`crate::verbs_sim`]; only the real providers and [`open`] need `rdma`.

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

use std::net::SocketAddr;
#[cfg(feature = "rdma")]
use std::time::Duration;

pub use transport::{RdmaConfig, RdmaStats, RdmaTransport};
pub use verbs::{Verbs, VerbsError};

use super::TransportError;
#[cfg(feature = "rdma")]
use super::bootstrap::Exchange;
#[cfg(feature = "rdma")]
use super::{Endpoints, Transport};

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

pub use super::bootstrap::coordinator_exchange;

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
    let mut exchange = coordinator_exchange(coordinator, rank, world, timeout);
    open_native(rank, world, Some(device_names), &mut exchange, cfg)
}

/// The hook of [`crate::select`]: [`open_devices`] with the devices from
/// [`DEVICES_ENV`], else the machine's only device for every peer; the queue-pair info goes
/// through `exchange` (the select's bootstrap, shared with its earlier rounds).
#[cfg(feature = "rdma")]
pub fn open(
    ep: &Endpoints,
    exchange: &mut Exchange<'_>,
) -> Result<Box<dyn Transport>, TransportError> {
    let devices = match std::env::var(DEVICES_ENV) {
        Ok(v) => Some(parse_devices(&v, ep.world)?),
        Err(_) => None,
    };
    let cfg = RdmaConfig {
        connect_timeout: ep.connect_timeout,
        ..RdmaConfig::default()
    };
    open_native(ep.rank, ep.world, devices.as_deref(), exchange, cfg)
}

/// Whether this machine can open the devices [`open`] would use, without touching the network:
/// the provider loads and every peer has a device. The select's vote is made of this.
#[cfg(feature = "rdma")]
pub fn local_ready(ep: &Endpoints) -> Result<(), TransportError> {
    if let Ok(v) = std::env::var(DEVICES_ENV) {
        parse_devices(&v, ep.world)?;
    }
    #[cfg(target_os = "linux")]
    {
        let verbs = ibverbs::IbVerbs;
        if std::env::var(DEVICES_ENV).is_err() {
            default_devices(&verbs, ep.rank, ep.world)?;
        } else if verbs
            .device_names()
            .map_err(|e| TransportError::Unsupported(e.to_string()))?
            .is_empty()
        {
            return Err(TransportError::Unsupported(format!(
                "{}: no RDMA device",
                verbs.provider()
            )));
        }
        Ok(())
    }
    #[cfg(target_os = "macos")]
    {
        let verbs =
            apple::AppleVerbs::load().map_err(|e| TransportError::Unsupported(e.to_string()))?;
        if std::env::var(DEVICES_ENV).is_err() {
            default_devices(&verbs, ep.rank, ep.world)?;
        }
        Ok(())
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Err(TransportError::Unsupported(
            "RDMA verbs are supported on Linux (libibverbs) and macOS (librdma) only".into(),
        ))
    }
}

#[cfg(all(feature = "rdma", target_os = "linux"))]
fn open_native(
    rank: usize,
    world: usize,
    devices: Option<&[Option<String>]>,
    exchange: &mut Exchange<'_>,
    cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let verbs = ibverbs::IbVerbs;
    let devices = match devices {
        Some(d) => d.to_vec(),
        None => default_devices(&verbs, rank, world)?,
    };
    Ok(Box::new(RdmaTransport::connect(
        verbs, rank, world, &devices, cfg, exchange,
    )?))
}

#[cfg(all(feature = "rdma", target_os = "macos"))]
fn open_native(
    rank: usize,
    world: usize,
    devices: Option<&[Option<String>]>,
    exchange: &mut Exchange<'_>,
    cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let verbs =
        apple::AppleVerbs::load().map_err(|e| TransportError::Unsupported(e.to_string()))?;
    let devices = match devices {
        Some(d) => d.to_vec(),
        None => default_devices(&verbs, rank, world)?,
    };
    Ok(Box::new(RdmaTransport::connect(
        verbs, rank, world, &devices, cfg, exchange,
    )?))
}

#[cfg(all(feature = "rdma", not(any(target_os = "linux", target_os = "macos"))))]
fn open_native(
    _rank: usize,
    _world: usize,
    _devices: Option<&[Option<String>]>,
    _exchange: &mut Exchange<'_>,
    _cfg: RdmaConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    Err(TransportError::Unsupported(
        "RDMA verbs are supported on Linux (libibverbs) and macOS (librdma) only".into(),
    ))
}

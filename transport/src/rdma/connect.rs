//! Set-up of the RDMA transport ([`RdmaTransport::connect`]): per peer open the device, create
//! the CQ and the QP (UC, RC where UC is refused), go to INIT, register the bounce buffers and
//! post the RECVs; all-gather the queue-pair info through the bootstrap; go to RTR and RTS; then
//! all-gather once more as a barrier, since UC drops what arrives at a QP not yet in RTR.

use std::collections::VecDeque;
use std::time::Instant;

use super::config::{RdmaConfig, RdmaStats};
use super::link::{Link, LinkState, POLL_BATCH, RECV_BIT, verbs_err};
use super::qpinfo::QpInfo;
use super::transport::{Exchange, RdmaTransport};
use super::verbs::{
    Gid, PathParams, QpCaps, QpEndpoint, QpType, Region, Verbs, VerbsError, is_ipv4_mapped,
};
use crate::TransportError;

/// A link between set-up steps.
struct Pending<V: Verbs> {
    qp: V::Qp,
    send_mr: V::Mr,
    recv_mr: V::Mr,
    cq: V::Cq,
    pd: V::Pd,
    ctx: V::Context,
    device: String,
    endpoint: QpEndpoint,
    sgid_index: u8,
    mtu: u32,
}

/// A deterministic initial PSN per (rank, peer) (24 bits).
fn initial_psn(rank: usize, peer: usize) -> u32 {
    ((rank as u32).wrapping_mul(0x9e37) ^ (peer as u32).wrapping_mul(0x7f4a) ^ 7) & 0x00ff_ffff
}

fn choose_gid<V: Verbs>(
    verbs: &V,
    ctx: &V::Context,
    cfg: &RdmaConfig,
    gid_table_len: u32,
    lid: u16,
) -> Result<(u8, Gid), VerbsError> {
    if let Some(index) = cfg.sgid_index {
        return Ok((index, verbs.query_gid(ctx, cfg.port, u32::from(index))?));
    }
    for index in 0..gid_table_len.min(256) {
        if let Ok(gid) = verbs.query_gid(ctx, cfg.port, index)
            && is_ipv4_mapped(&gid)
        {
            return Ok((index as u8, gid));
        }
    }
    if lid != 0 {
        // InfiniBand: LID routing, GID 0 only for the record.
        return Ok((0, verbs.query_gid(ctx, cfg.port, 0).unwrap_or([0; 16])));
    }
    Err(VerbsError::Unsupported(
        "no IPv4-mapped GID on the port: Thunderbolt RDMA ports publish one only once the \
         interface has an IPv4 address (e.g. `ifconfig <interface> inet 169.254.0.1 netmask \
         255.255.0.0 alias`)"
            .into(),
    ))
}

fn setup_link<V: Verbs>(
    verbs: &V,
    cfg: &RdmaConfig,
    rank: usize,
    peer: usize,
    device: &str,
) -> Result<Pending<V>, TransportError> {
    let err = |e| verbs_err(peer, device, e);
    let ctx = verbs.open(device).map_err(err)?;
    let pd = verbs.alloc_pd(&ctx).map_err(err)?;
    let cq = verbs
        .create_cq(&ctx, cfg.effective_cq_depth())
        .map_err(err)?;
    let caps = QpCaps {
        max_send_wr: cfg.send_depth,
        max_recv_wr: cfg.recv_depth,
    };
    let (mut qp, qp_type) = match verbs.create_qp(&pd, &cq, cfg.qp_type, caps) {
        Ok(qp) => (qp, cfg.qp_type),
        Err(e) if cfg.qp_type == QpType::Uc && cfg.rc_fallback => {
            tracing::info!(peer, device, error = %e, "UC queue pair refused; trying RC");
            (
                verbs.create_qp(&pd, &cq, QpType::Rc, caps).map_err(err)?,
                QpType::Rc,
            )
        }
        Err(e) => return Err(err(e)),
    };
    let port = verbs.query_port(&ctx, cfg.port).map_err(err)?;
    if !port.active {
        return Err(err(VerbsError::Unsupported(format!(
            "port {} is not active",
            cfg.port
        ))));
    }
    let (sgid_index, gid) =
        choose_gid(verbs, &ctx, cfg, port.gid_table_len, port.lid).map_err(err)?;
    verbs.modify_to_init(&mut qp, cfg.port).map_err(err)?;
    let chunk = cfg.chunk;
    let send_region = Region::new(cfg.send_depth as usize * chunk).map_err(err)?;
    let recv_region = Region::new(cfg.recv_depth as usize * chunk).map_err(err)?;
    let send_mr = verbs.reg_mr(&pd, send_region).map_err(err)?;
    let recv_mr = verbs.reg_mr(&pd, recv_region).map_err(err)?;
    for slot in 0..cfg.recv_depth {
        verbs
            .post_recv(
                &mut qp,
                &recv_mr,
                slot as usize * chunk,
                chunk,
                RECV_BIT | u64::from(slot),
            )
            .map_err(err)?;
    }
    let mtu = if port.active_mtu == 0 {
        cfg.mtu
    } else {
        cfg.mtu.min(port.active_mtu)
    };
    let endpoint = QpEndpoint {
        qpn: verbs.qp_num(&qp),
        psn: initial_psn(rank, peer),
        lid: port.lid,
        gid,
        qp_type,
    };
    Ok(Pending {
        qp,
        send_mr,
        recv_mr,
        cq,
        pd,
        ctx,
        device: device.to_string(),
        endpoint,
        sgid_index,
        mtu,
    })
}

impl<V: Verbs> RdmaTransport<V> {
    /// Connects `rank` of `world`: `devices[p]` names the device of the link to rank `p`
    /// (`None`: no RDMA link; the entry for `rank` itself is ignored); `exchange` is the
    /// bootstrap all-gather, called twice (queue-pair info, then a barrier).
    pub fn connect(
        verbs: V,
        rank: usize,
        world: usize,
        devices: &[Option<String>],
        cfg: RdmaConfig,
        exchange: &mut Exchange<'_>,
    ) -> Result<Self, TransportError> {
        cfg.validate()?;
        if rank >= world {
            return Err(TransportError::Invalid(format!(
                "rank {rank} is not below world {world}"
            )));
        }
        if devices.len() != world {
            return Err(TransportError::Invalid(format!(
                "RDMA: {} device entries for a world of {world}",
                devices.len()
            )));
        }
        let mut pending: Vec<Option<Pending<V>>> = Vec::with_capacity(world);
        for (peer, dev) in devices.iter().enumerate() {
            pending.push(match dev {
                Some(dev) if peer != rank => Some(setup_link(&verbs, &cfg, rank, peer, dev)?),
                _ => None,
            });
        }
        let ours = QpInfo {
            rank: rank as u32,
            world: world as u32,
            chunk: cfg.chunk as u32,
            recv_depth: cfg.recv_depth,
            endpoints: pending
                .iter()
                .map(|p| p.as_ref().map(|p| p.endpoint))
                .collect(),
        };
        let blobs = exchange(&ours.encode())?;
        if blobs.len() != world {
            return Err(TransportError::Bootstrap(format!(
                "RDMA: the all-gather returned {} blobs for a world of {world}",
                blobs.len()
            )));
        }
        let mut links = Vec::with_capacity(world);
        for (peer, p) in pending.into_iter().enumerate() {
            if peer == rank {
                links.push(None);
                continue;
            }
            let info = QpInfo::decode(&blobs[peer], peer, world)?;
            let theirs = info.endpoints.get(rank).copied().flatten();
            let p = match (p, theirs) {
                (None, None) => {
                    links.push(None);
                    continue;
                }
                (Some(p), Some(theirs)) => (p, theirs),
                (mine, _) => {
                    return Err(TransportError::Bootstrap(format!(
                        "RDMA: rank {peer} {} a link to rank {rank}, but rank {rank} {}",
                        if mine.is_some() { "has no" } else { "has" },
                        if mine.is_some() {
                            "has one"
                        } else {
                            "has none"
                        },
                    )));
                }
            };
            let (mut p, theirs) = p;
            if info.chunk as usize != cfg.chunk {
                return Err(TransportError::Bootstrap(format!(
                    "RDMA: rank {peer} uses {}-byte bounce buffers, rank {rank} {}",
                    info.chunk, cfg.chunk
                )));
            }
            if theirs.qp_type != p.endpoint.qp_type {
                return Err(TransportError::Bootstrap(format!(
                    "RDMA: rank {peer} made a {:?} queue pair, rank {rank} a {:?} one",
                    theirs.qp_type, p.endpoint.qp_type
                )));
            }
            if !(2..=1024).contains(&info.recv_depth) {
                return Err(TransportError::Bootstrap(format!(
                    "RDMA: rank {peer} announces recv_depth {}",
                    info.recv_depth
                )));
            }
            let path = PathParams {
                port: cfg.port,
                mtu: p.mtu,
                sgid_index: p.sgid_index,
            };
            let err = |e| verbs_err(peer, &p.device, e);
            verbs
                .modify_to_rtr(&mut p.qp, &theirs, &path)
                .map_err(err)?;
            verbs
                .modify_to_rts(&mut p.qp, p.endpoint.psn)
                .map_err(err)?;
            links.push(Some(Link {
                st: LinkState {
                    peer,
                    credits: info.recv_depth,
                    to_return: 0,
                    peer_depth: info.recv_depth,
                    free_send: (0..cfg.send_depth).rev().collect(),
                    slot_op: vec![None; cfg.send_depth as usize],
                    tx_seq: 0,
                    rx_seq: 0,
                    next_tx_msg: 0,
                    next_rx_msg: 0,
                    next_op_seq: 0,
                    sends: VecDeque::new(),
                    first_unposted: 0,
                    recvs: VecDeque::new(),
                    held: VecDeque::new(),
                    rx: None,
                    failed: None,
                    last_progress: Instant::now(),
                    stalled: false,
                },
                qp: p.qp,
                send_mr: p.send_mr,
                recv_mr: p.recv_mr,
                cq: p.cq,
                _pd: p.pd,
                _ctx: p.ctx,
                device: p.device,
            }));
        }
        // Barrier: every queue pair is in RTR before anyone sends (UC drops what arrives earlier).
        exchange(b"TBQ1-ready")?;
        Ok(RdmaTransport {
            links,
            bufs: Vec::new(),
            ready: VecDeque::new(),
            wcs: Vec::with_capacity(POLL_BATCH),
            stats: RdmaStats::default(),
            rank,
            world,
            cfg,
            verbs,
        })
    }
}

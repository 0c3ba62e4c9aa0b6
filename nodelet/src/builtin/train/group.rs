//! The ranks of a built-in fine-tune as a group: they find each other through the same
//! bootstrap coordinator as `tb-shard`'s stages and sum their gradients with tb-transport's
//! ring all-reduce, in buckets so that no single transfer holds the whole gradient twice. A
//! group of one does nothing.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tb_transport::collectives::{CollectiveOptions, Communicator};
use tb_transport::tcp::TcpConfig;
use tb_transport::wire::DType;
use tb_transport::{Endpoints, Preference, TransportError, select};

/// Gradients are all-reduced this many bytes at a time.
pub const BUCKET_BYTES: usize = 4 << 20;
/// The longest name [`Group::broadcast_name`] carries.
const NAME_BYTES: usize = 256;

/// This rank's handle on the others (None: alone).
pub struct Group {
    comm: Option<Communicator>,
    rank: usize,
    world: usize,
}

impl Group {
    /// Connects rank `rank` of `hosts.len()` through `coordinator`.
    pub fn connect(
        rank: usize,
        hosts: &[IpAddr],
        coordinator: SocketAddr,
        transport: Preference,
        connect_timeout: Duration,
        step_timeout: Duration,
    ) -> Result<Group, TransportError> {
        let world = hosts.len();
        if world <= 1 {
            return Ok(Group {
                comm: None,
                rank,
                world: 1,
            });
        }
        let ep = Endpoints {
            rank,
            world,
            peers: hosts.iter().map(|h| SocketAddr::new(*h, 0)).collect(),
            coordinator,
            connect_timeout,
        };
        let t = select::open_endpoints(
            &ep,
            transport,
            TcpConfig::for_endpoints(&ep, tb_engine::cpu_threads()),
        )?;
        let opts = CollectiveOptions {
            // A slow rank's step is not a dead peer; a closed connection still fails at once.
            timeout: step_timeout,
            ..CollectiveOptions::default()
        };
        Ok(Group {
            comm: Some(Communicator::new(t, opts)),
            rank,
            world,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Sums `values` over every rank, in place, [`BUCKET_BYTES`] at a time.
    pub fn all_reduce(&mut self, values: &mut [f32]) -> Result<(), TransportError> {
        let Some(comm) = self.comm.as_mut() else {
            return Ok(());
        };
        for bucket in values.chunks_mut(BUCKET_BYTES / 4) {
            let mut bytes: Vec<u8> = bucket.iter().flat_map(|v| v.to_le_bytes()).collect();
            comm.all_reduce(&mut bytes, DType::F32)?;
            for (v, b) in bucket.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Ok(())
    }

    /// Rank 0's `name` (at most 256 bytes) on every rank.
    pub fn broadcast_name(&mut self, name: &str) -> Result<String, TransportError> {
        let Some(comm) = self.comm.as_mut() else {
            return Ok(name.to_string());
        };
        let mut buf = [0u8; NAME_BYTES + 2];
        if comm.rank() == 0 {
            let bytes = &name.as_bytes()[..name.len().min(NAME_BYTES)];
            buf[..2].copy_from_slice(&(bytes.len() as u16).to_le_bytes());
            buf[2..2 + bytes.len()].copy_from_slice(bytes);
        }
        comm.broadcast(&mut buf, 0)?;
        let len = usize::from(u16::from_le_bytes([buf[0], buf[1]])).min(NAME_BYTES);
        Ok(String::from_utf8_lossy(&buf[2..2 + len]).into_owned())
    }

    /// Waits for every rank.
    pub fn barrier(&mut self) -> Result<(), TransportError> {
        match self.comm.as_mut() {
            Some(c) => c.barrier(),
            None => Ok(()),
        }
    }
}

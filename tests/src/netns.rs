//! An emulated lab of Macs on one Linux host: network namespaces stand for the Macs, shaped
//! point-to-point links for the Thunderbolt cables, and the real `tb-controller`, `tb-nodelet`s
//! and `tbctl` run inside the namespaces. It needs root, `ip` and `tc` (iproute2) and
//! `/dev/net/tun`; [`EmulatedLab::unavailable`] says why a test cannot run.
//!
//! ```text
//!   namespace tbe<pid>-<n>-hub: bridge br0 10.200.0.1/24 ── tb-controller, tbctl
//!        │ m1        │ m2        ...      (veth pairs: hub side m<i> on br0, Mac side `mgmt`)
//!   tbe<pid>-<n>-m1  tbe<pid>-<n>-m2 ...  one per Mac: mgmt 10.200.0.<10+i>/24, lo, and
//!        tb1 ═══════ tb1                  one interface per cable end (tb1, tb2, ... in the
//!                                         order the cables were declared), a /30 each:
//!                                         cable N is 10.201.N.1 (end a) – 10.201.N.2 (end b)
//! ```
//!
//! Names: every namespace of a lab is `tbe<pid>-<n>-...` (pid of the test process, n-th lab in
//! it), so concurrent test runs never clash; interface names only need to be unique inside
//! their namespace, so they are short and fixed. Namespaces left behind by a test process that
//! died (its pid no longer alive) are deleted when the next lab is built.
//!
//! Shaping: each cable end's egress gets `tc qdisc add dev X root tbf rate R burst B latency
//! 20ms`, so each direction carries at most R. A cable with a delay does not use `netem`: the
//! kernel of the VMs these tests were written on is built without `sch_netem` (nor `fq`, which
//! would honour BPF departure times; it has only tbf, htb, pfifo and ingress/clsact), and one
//! way that works on every kernel with TUN is better than two. Such a cable is instead a pair
//! of TUN devices, one in each Mac's namespace, and the test process is the wire: a delay line
//! (two threads per direction) reads each packet one end sends, holds it for the delay and
//! writes it into the other end. The TUN devices are shaped with the same `tbf`, so the rate
//! is enforced by the kernel and the delay by the line; the probe's round trip grows by twice
//! the delay. TUN devices carry IP packets (no Ethernet, no ARP), which is all the probes and
//! tb's TCP traffic need.
//!
//! Servers bind only to addresses inside these namespaces: the controller to 10.200.0.1, each
//! nodelet to its management address and its probe server to its cable addresses.
//!
//! A replicated control plane: [`EmulatedLab::start_controllers`] runs N controllers as one
//! Raft cluster instead, each in its own namespace `tbe<pid>-<n>-c<id>` joined to br0 like a
//! Mac (veth `c<id>` on the hub, `mgmt` inside) at 10.200.0.<1+id>; tbctl (in the hub) and the
//! nodelets are given all of them. [`NsRuntime`] runs the harness's own gRPC client inside the
//! hub namespace. Cutting and healing the network between namespaces is `crate::partition`.
//!
//! Dropping the lab tears everything down: the processes it started (and the rank processes
//! their nodelets started, and anything else still running in its namespaces) are killed, the
//! delay lines stopped, and every namespace deleted, which removes the interfaces in it. When
//! the test failed, the lab first prints `tbctl topology`, the Nodes, Links and services, each
//! namespace's addresses and qdiscs (with counters), and the tail of every process's log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::lab::{
    LOG_TAIL_LINES, Proc, bounded_output, kill_leftover_ranks, nodelet_bin, process_alive,
};
use crate::tbctl::TbctlOutput;
use crate::workdir::TestDir;

/// The controller's address in the hub namespace.
pub const HUB_ADDRESS: &str = "10.200.0.1";
/// The controller's port.
pub const CONTROLLER_PORT: u16 = 7400;
/// At most this many controllers (their addresses sit below the Macs').
pub const MAX_CONTROLLERS: u64 = 8;
/// Each nodelet's `--listen` port, on its management address.
pub const NODELET_PORT: u16 = 7600;
/// Each nodelet's `--port-range` (every Mac has its own network, so they can all be the same).
pub const RANK_PORTS: (u16, u16) = (32323, 32330);
/// The nodelets' `--heartbeat-ms`.
pub const HEARTBEAT_MS: u64 = 300;
/// The controller's `--node-grace-ms`.
pub const NODE_GRACE_MS: u64 = 3000;
/// The nominal speed every port states in the topology file (Thunderbolt 5): the same for
/// every cable, so only the probes can tell the cables apart.
pub const NOMINAL_GBPS: f64 = 80.0;
/// Longest a tbctl run may take (each request is also given `--timeout 5s`).
pub const TBCTL_TIMEOUT: Duration = Duration::from_secs(30);
/// The tbf queue bound (`latency`): how long a packet may wait for tokens before it is dropped.
const TBF_QUEUE: &str = "20ms";

/// How a cable is shaped, the same in both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// tbf rate, Mbit/s.
    pub rate_mbit: u32,
    /// Added to each direction (zero: none; else the cable is a delay line, see the module).
    pub delay: Duration,
}

impl Shape {
    pub fn mbit(rate_mbit: u32) -> Shape {
        assert!(rate_mbit > 0, "a cable needs a positive rate");
        Shape {
            rate_mbit,
            delay: Duration::ZERO,
        }
    }

    pub fn with_delay(self, delay: Duration) -> Shape {
        Shape { delay, ..self }
    }

    /// tbf's bucket: 2 ms at the rate, at least 64 KiB (a TSO packet on a veth passes whole).
    fn burst_bytes(&self) -> u64 {
        let per_2ms = u64::from(self.rate_mbit) * 1_000_000 / 8 / 500;
        per_2ms.max(64 * 1024)
    }
}

/// A Mac as the topology file describes it.
#[derive(Debug, Clone)]
pub struct MacSpec {
    pub name: String,
    pub chip: String,
    pub gpu_cores: u32,
    /// A quantity (`64Gi`): the capacity the nodelet reports.
    pub memory: String,
}

impl MacSpec {
    /// An M4 Max with 40 GPU cores and 64Gi.
    pub fn new(name: &str) -> MacSpec {
        MacSpec {
            name: name.to_string(),
            chip: "Apple M4 Max".into(),
            gpu_cores: 40,
            memory: "64Gi".into(),
        }
    }

    pub fn memory(mut self, memory: &str) -> MacSpec {
        self.memory = memory.to_string();
        self
    }
}

/// What a cable is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CableKind {
    /// A veth pair.
    Veth,
    /// Two TUN devices and a delay line in the test process.
    DelayLine,
}

/// One end of a cable.
#[derive(Debug, Clone, PartialEq)]
pub struct CableEnd {
    pub mac: String,
    /// The port's name in the topology file, also the interface's name (`tb1`, ...).
    pub port: String,
    pub address: String,
}

impl CableEnd {
    /// `mac/port`, as the topology file and the Links name it.
    pub fn uuid(&self) -> String {
        format!("{}/{}", self.mac, self.port)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cable {
    pub a: CableEnd,
    pub b: CableEnd,
    pub shape: Shape,
    pub kind: CableKind,
}

impl Cable {
    /// Whether this cable joins Macs `x` and `y` (either way round).
    pub fn joins(&self, x: &str, y: &str) -> bool {
        (self.a.mac == x && self.b.mac == y) || (self.a.mac == y && self.b.mac == x)
    }
}

/// Builds an [`EmulatedLab`]: Macs and cables, then [`EmulatedLabBuilder::build`].
pub struct EmulatedLabBuilder {
    name: String,
    macs: Vec<MacSpec>,
    cables: Vec<(String, String, Shape)>,
}

impl EmulatedLabBuilder {
    pub fn mac(mut self, mac: MacSpec) -> Self {
        assert!(
            !self.macs.iter().any(|m| m.name == mac.name),
            "Mac {} is declared twice",
            mac.name
        );
        self.macs.push(mac);
        self
    }

    /// A cable between Macs `a` and `b` (declared before); `a` is end a (10.201.N.1).
    pub fn cable(mut self, a: &str, b: &str, shape: Shape) -> Self {
        self.cables.push((a.to_string(), b.to_string(), shape));
        self
    }

    /// Creates the namespaces, interfaces, addresses and shaping. Panics, naming the command
    /// and what it printed, when anything fails (what was made is torn down).
    pub fn build(self) -> EmulatedLab {
        if let Some(why) = EmulatedLab::unavailable() {
            panic!("the emulated lab cannot run here: {why}");
        }
        assert!(!self.macs.is_empty(), "an emulated lab needs Macs");
        assert!(self.macs.len() <= 200, "at most 200 Macs");
        assert!(self.cables.len() <= 254, "at most 254 cables");
        for (a, b, _) in &self.cables {
            for m in [a, b] {
                assert!(
                    self.macs.iter().any(|x| &x.name == m),
                    "cable {a}–{b}: no Mac {m} declared"
                );
            }
            assert_ne!(a, b, "a cable joins two different Macs");
        }
        sweep_stale_namespaces();
        static LABS: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "tbe{}-{}",
            std::process::id(),
            LABS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = TestDir::new(&self.name);
        let home = dir.sub("home");
        let mut lab = EmulatedLab {
            hub: format!("{prefix}-hub"),
            prefix: prefix.clone(),
            controllers: Vec::new(),
            partitioned: std::collections::BTreeMap::new(),
            macs: Vec::new(),
            cables: Vec::new(),
            delay_lines: Vec::new(),
            procs: Vec::new(),
            data_dirs: Vec::new(),
            namespaces: Vec::new(),
            home,
            controller: None,
            files: AtomicU32::new(0),
            dir,
        };
        let started = Instant::now();
        lab.make_hub();
        for (i, spec) in self.macs.into_iter().enumerate() {
            let ns = format!("{prefix}-m{}", i + 1);
            lab.make_mac(ns, spec, i + 1);
        }
        for (n, (a, b, shape)) in self.cables.into_iter().enumerate() {
            lab.make_cable(n + 1, &a, &b, shape);
        }
        crate::step!(
            "emulated lab {}: {} Macs, {} cables in {:.1}s",
            prefix,
            lab.macs.len(),
            lab.cables.len(),
            started.elapsed().as_secs_f64()
        );
        lab
    }
}

/// A Mac's namespace.
#[derive(Debug, Clone)]
pub struct MacNs {
    pub spec: MacSpec,
    pub namespace: String,
    /// Its address on the management network (10.200.0.<10+i>).
    pub address: String,
    /// The ports made so far (`tb1`, ...).
    ports: u32,
}

/// A controller of a replicated control plane, in its own namespace.
#[derive(Debug, Clone)]
pub struct ControllerNs {
    pub id: u64,
    pub namespace: String,
    /// 10.200.0.<1+id>.
    pub address: String,
}

impl ControllerNs {
    /// `ADDRESS:PORT`, what clients dial.
    pub fn endpoint(&self) -> String {
        format!("{}:{CONTROLLER_PORT}", self.address)
    }

    /// The name of its process (and log file) in the lab, also its name for `crate::partition`.
    pub fn name(&self) -> String {
        format!("controller-{}", self.id)
    }
}

/// Macs in namespaces, cables between them, and the tb processes running there. See the
/// module documentation.
pub struct EmulatedLab {
    hub: String,
    /// `tbe<pid>-<n>`, every namespace's name starts with it.
    prefix: String,
    /// The controllers of [`EmulatedLab::start_controllers`] (empty with one hub controller).
    controllers: Vec<ControllerNs>,
    /// The rules `crate::partition` installed, per namespace.
    pub(crate) partitioned: std::collections::BTreeMap<String, Vec<String>>,
    macs: Vec<MacNs>,
    cables: Vec<Cable>,
    delay_lines: Vec<DelayLine>,
    /// Processes started in the namespaces, with the namespace.
    procs: Vec<(String, Proc)>,
    /// The nodelets' data directories (for their ranks' pid files).
    data_dirs: Vec<PathBuf>,
    /// Namespaces made, in order (deleted in reverse).
    namespaces: Vec<String>,
    home: PathBuf,
    /// The controller's address, once started.
    controller: Option<String>,
    files: AtomicU32,
    // Last: dropped after everything else, so logs are printed before the kept path.
    dir: TestDir,
}

impl EmulatedLab {
    pub fn builder(name: &str) -> EmulatedLabBuilder {
        EmulatedLabBuilder {
            name: name.to_string(),
            macs: Vec::new(),
            cables: Vec::new(),
        }
    }

    /// Why an emulated lab cannot be built on this machine, or `None` when it can: it needs
    /// Linux, root, `ip` and `tc` (iproute2), `/dev/net/tun`, and the right to make a network
    /// namespace (checked by making and deleting one).
    pub fn unavailable() -> Option<String> {
        if !cfg!(target_os = "linux") {
            return Some("network namespaces are Linux-only".into());
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: geteuid has no preconditions.
            let euid = unsafe { libc::geteuid() };
            if euid != 0 {
                return Some(format!("it needs root (running as uid {euid})"));
            }
        }
        for tool in ["ip", "tc"] {
            match Command::new(tool).arg("-V").stdin(Stdio::null()).output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => return Some(format!("`{tool} -V` exited {}", o.status)),
                Err(e) => {
                    return Some(format!("`{tool}` cannot be run ({e}); install iproute2"));
                }
            }
        }
        if !Path::new("/dev/net/tun").exists() {
            return Some("/dev/net/tun is missing (delayed cables are TUN devices)".into());
        }
        // Tests of one process ask at once: each probe namespace has its own name.
        static PROBES: AtomicU32 = AtomicU32::new(0);
        let probe = format!(
            "tbe{}-probe{}",
            std::process::id(),
            PROBES.fetch_add(1, Ordering::Relaxed)
        );
        let made = Command::new("ip").args(["netns", "add", &probe]).output();
        match made {
            Ok(o) if o.status.success() => {
                let _ = Command::new("ip").args(["netns", "del", &probe]).output();
                None
            }
            Ok(o) => Some(format!(
                "`ip netns add` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Some(format!("`ip netns add` cannot be run: {e}")),
        }
    }

    /// Whether an emulated lab can be built here (see [`EmulatedLab::unavailable`]).
    pub fn available() -> bool {
        Self::unavailable().is_none()
    }

    // --- building ----------------------------------------------------------------------------

    fn add_namespace(&mut self, ns: &str) {
        sh(&format!("ip netns add {ns}"));
        self.namespaces.push(ns.to_string());
        sh(&format!("ip -n {ns} link set lo up"));
    }

    fn make_hub(&mut self) {
        let hub = self.hub.clone();
        self.add_namespace(&hub);
        sh(&format!("ip -n {hub} link add br0 type bridge"));
        sh(&format!("ip -n {hub} addr add {HUB_ADDRESS}/24 dev br0"));
        sh(&format!("ip -n {hub} link set br0 up"));
    }

    fn make_mac(&mut self, ns: String, spec: MacSpec, i: usize) {
        self.add_namespace(&ns);
        let hub = &self.hub;
        let address = format!("10.200.0.{}", 10 + i);
        sh(&format!(
            "ip -n {hub} link add m{i} type veth peer name mgmt netns {ns}"
        ));
        sh(&format!("ip -n {hub} link set m{i} master br0 up"));
        sh(&format!("ip -n {ns} addr add {address}/24 dev mgmt"));
        sh(&format!("ip -n {ns} link set mgmt up"));
        self.macs.push(MacNs {
            spec,
            namespace: ns,
            address,
            ports: 0,
        });
    }

    fn next_port(&mut self, mac: &str) -> (String, String) {
        let m = self
            .macs
            .iter_mut()
            .find(|m| m.spec.name == mac)
            .unwrap_or_else(|| panic!("no Mac {mac}"));
        m.ports += 1;
        (m.namespace.clone(), format!("tb{}", m.ports))
    }

    fn make_cable(&mut self, n: usize, a: &str, b: &str, shape: Shape) {
        let (ns_a, port_a) = self.next_port(a);
        let (ns_b, port_b) = self.next_port(b);
        let addr_a = format!("10.201.{n}.1");
        let addr_b = format!("10.201.{n}.2");
        let kind = if shape.delay.is_zero() {
            sh(&format!(
                "ip -n {ns_a} link add {port_a} type veth peer name {port_b} netns {ns_b}"
            ));
            CableKind::Veth
        } else {
            let fd_a = tun::create_in(&ns_a, &port_a).unwrap_or_else(|e| {
                panic!("creating TUN device {port_a} in namespace {ns_a}: {e}")
            });
            let fd_b = tun::create_in(&ns_b, &port_b).unwrap_or_else(|e| {
                panic!("creating TUN device {port_b} in namespace {ns_b}: {e}")
            });
            self.delay_lines.push(DelayLine::start(
                &format!("{a}/{port_a}-{b}/{port_b}"),
                fd_a,
                fd_b,
                shape.delay,
            ));
            CableKind::DelayLine
        };
        for (ns, port, addr) in [(&ns_a, &port_a, &addr_a), (&ns_b, &port_b, &addr_b)] {
            sh(&format!("ip -n {ns} addr add {addr}/30 dev {port}"));
            sh(&format!("ip -n {ns} link set {port} up"));
            sh(&format!(
                "tc -n {ns} qdisc add dev {port} root tbf rate {}mbit burst {} latency {TBF_QUEUE}",
                shape.rate_mbit,
                shape.burst_bytes()
            ));
        }
        self.cables.push(Cable {
            a: CableEnd {
                mac: a.to_string(),
                port: port_a,
                address: addr_a,
            },
            b: CableEnd {
                mac: b.to_string(),
                port: port_b,
                address: addr_b,
            },
            shape,
            kind,
        });
    }

    // --- what it is --------------------------------------------------------------------------

    /// The hub namespace (the controller's and tbctl's).
    pub fn hub(&self) -> &str {
        &self.hub
    }

    /// A runtime in the hub namespace, for the harness's gRPC client (see [`NsRuntime`]).
    pub fn hub_runtime(&self) -> NsRuntime {
        NsRuntime::start(&self.hub)
    }

    pub fn macs(&self) -> &[MacNs] {
        &self.macs
    }

    pub fn mac(&self, name: &str) -> &MacNs {
        self.macs
            .iter()
            .find(|m| m.spec.name == name)
            .unwrap_or_else(|| panic!("no Mac {name}"))
    }

    pub fn cables(&self) -> &[Cable] {
        &self.cables
    }

    /// The cable between Macs `x` and `y`, if any.
    pub fn cable_between(&self, x: &str, y: &str) -> Option<&Cable> {
        self.cables.iter().find(|c| c.joins(x, y))
    }

    /// The test directory (data directories, logs, files written).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The controllers started by [`EmulatedLab::start_controllers`].
    pub fn controllers(&self) -> &[ControllerNs] {
        &self.controllers
    }

    /// Controller `id` of [`EmulatedLab::start_controllers`].
    pub fn controller(&self, id: u64) -> &ControllerNs {
        self.controllers
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no controller {id}"))
    }

    /// The controller's `HOST:PORT`, or every controller's, comma-separated (what tbctl's
    /// `--server` and the nodelets are given); panics before a controller is started.
    pub fn controller_addr(&self) -> &str {
        self.controller
            .as_deref()
            .expect("the controller is not started")
    }

    /// The lab as a topology file (`tb_api::lab::LabFile`): every Mac with its chip, GPU
    /// cores, memory and ports (interface = port name, address, [`NOMINAL_GBPS`]), and a link
    /// per cable.
    pub fn topology_yaml(&self) -> String {
        let mut y = String::from("macs:\n");
        for m in &self.macs {
            y += &format!(
                "  - name: {}\n    chip: {}\n    gpuCores: {}\n    memory: {}\n    ports:\n",
                m.spec.name, m.spec.chip, m.spec.gpu_cores, m.spec.memory
            );
            let ends = self
                .cables
                .iter()
                .flat_map(|c| [&c.a, &c.b])
                .filter(|e| e.mac == m.spec.name);
            for e in ends {
                y += &format!(
                    "      - {{name: {p}, interface: {p}, address: {a}, speedGbps: {NOMINAL_GBPS}}}\n",
                    p = e.port,
                    a = e.address
                );
            }
        }
        y += "links:\n";
        for c in &self.cables {
            y += &format!("  - {{between: [{}, {}]}}\n", c.a.uuid(), c.b.uuid());
        }
        y
    }

    /// Writes [`EmulatedLab::topology_yaml`] to `lab.yaml` in the test directory.
    pub fn write_topology(&self) -> PathBuf {
        self.dir.write("lab.yaml", &self.topology_yaml())
    }

    /// Writes a file into the test directory.
    pub fn write_file(&self, name: &str, contents: &str) -> PathBuf {
        self.dir.write(name, contents)
    }

    // --- running things in the namespaces ----------------------------------------------------

    /// `ip netns exec NS PROGRAM ARGS...`, run to completion; panics (with the command and
    /// its stderr) unless it exits 0.
    pub fn run_in(&self, ns: &str, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", ns, program];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Starts `program ARGS` in namespace `ns` (`ip netns exec`, which execs the program, so
    /// the process is the program itself), its output to `<name>.log` in the test directory;
    /// killed when the lab is dropped. Returns its pid.
    pub fn spawn_in(&mut self, ns: &str, name: &str, program: &Path, args: Vec<String>) -> u32 {
        let mut full = vec![
            "netns".to_string(),
            "exec".into(),
            ns.into(),
            program.display().to_string(),
        ];
        full.extend(args);
        let log = self.dir.path().join(format!("{name}.log"));
        let proc = Proc::start(name, Path::new("ip"), full, log);
        let pid = proc.pid().expect("a started process has a pid");
        self.procs.push((ns.to_string(), proc));
        pid
    }

    fn proc_mut(&mut self, name: &str) -> Option<&mut Proc> {
        self.procs
            .iter_mut()
            .map(|(_, p)| p)
            .find(|p| p.name() == name)
    }

    /// Panics with its log tail if process `name` has exited.
    fn check_running(&mut self, name: &str) {
        if let Some(p) = self.proc_mut(name)
            && let Some(status) = p.exit_status()
        {
            panic!(
                "{name} exited ({status}); log {} (last {LOG_TAIL_LINES} lines):\n{}",
                p.log_path().display(),
                p.log_tail(LOG_TAIL_LINES)
            );
        }
    }

    // --- tb ----------------------------------------------------------------------------------

    /// Starts `tb-controller` in the hub namespace on [`HUB_ADDRESS`]:[`CONTROLLER_PORT`] (a
    /// cluster of one) and waits until it answers tbctl.
    pub async fn start_controller(&mut self) {
        let addr = format!("{HUB_ADDRESS}:{CONTROLLER_PORT}");
        let data = self.dir.path().join("controller");
        let args = vec![
            "--id".to_string(),
            "1".into(),
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--heartbeat-ms".into(),
            "50".into(),
            "--node-grace-ms".into(),
            NODE_GRACE_MS.to_string(),
        ];
        let args = [args, crate::auth::controller_args()].concat();
        let hub = self.hub.clone();
        self.spawn_in(&hub, "controller", &crate::bins::controller(), args);
        self.controller = Some(addr.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.check_running("controller");
            let out = self.tbctl(&["get", "nodes", "-o", "json"]).await;
            if out.success() {
                crate::step!("controller serving at {addr} in {hub}");
                return;
            }
            if Instant::now() > deadline {
                panic!("the controller at {addr} does not answer after 30s; last: {out}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts `n` controllers as one Raft cluster (`--initial-cluster`), each in its own
    /// namespace on br0 (see the module documentation), with the harness's cluster secret, CA
    /// and admin token, and waits until tbctl reaches the cluster and a leader is elected.
    pub async fn start_controllers(&mut self, n: u64) {
        assert!(
            (1..=MAX_CONTROLLERS).contains(&n),
            "1 to {MAX_CONTROLLERS} controllers"
        );
        assert!(
            self.controller.is_none(),
            "the controllers are already started"
        );
        let hub = self.hub.clone();
        for id in 1..=n {
            let c = ControllerNs {
                id,
                namespace: format!("{}-c{id}", self.prefix),
                address: format!("10.200.0.{}", 1 + id),
            };
            self.add_namespace(&c.namespace);
            let ns = &c.namespace;
            sh(&format!(
                "ip -n {hub} link add c{id} type veth peer name mgmt netns {ns}"
            ));
            sh(&format!("ip -n {hub} link set c{id} master br0 up"));
            sh(&format!("ip -n {ns} addr add {}/24 dev mgmt", c.address));
            sh(&format!("ip -n {ns} link set mgmt up"));
            self.controllers.push(c);
        }
        let initial: Vec<String> = self
            .controllers
            .iter()
            .map(|c| format!("{}={}", c.id, c.endpoint()))
            .collect();
        for c in self.controllers.clone() {
            let data = self.dir.path().join(c.name());
            let args = vec![
                "--id".to_string(),
                c.id.to_string(),
                "--listen".into(),
                c.endpoint(),
                "--data-dir".into(),
                data.display().to_string(),
                "--initial-cluster".into(),
                initial.join(","),
                "--heartbeat-ms".into(),
                "50".into(),
                "--node-grace-ms".into(),
                NODE_GRACE_MS.to_string(),
            ];
            let args = [args, crate::auth::controller_args()].concat();
            self.spawn_in(&c.namespace, &c.name(), &crate::bins::controller(), args);
        }
        let servers: Vec<String> = self.controllers.iter().map(|c| c.endpoint()).collect();
        self.controller = Some(servers.join(","));
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            for c in self.controllers.clone() {
                self.check_running(&c.name());
            }
            let out = self.tbctl(&["cluster", "status", "-o", "json"]).await;
            if out.success() && out.json()["leader"].as_u64().unwrap_or(0) > 0 {
                crate::step!("{n} controllers serving, leader {}", out.json()["leader"]);
                break;
            }
            if Instant::now() > deadline {
                panic!("the {n} controllers have no leader after 40s; last: {out}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Writes need the leader's first entry committed and the admin user in place.
        loop {
            let out = self.tbctl(&["get", "nodes", "-o", "json"]).await;
            if out.success() {
                return;
            }
            if Instant::now() > deadline {
                panic!("the {n} controllers do not answer tbctl after 40s; last: {out}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A join token from `tbctl token create`, good for every Mac of the lab.
    pub async fn create_token(&self) -> String {
        let uses = self.macs.len().max(1).to_string();
        let token = self
            .tbctl_ok(&["token", "create", "--uses", &uses])
            .await
            .stdout
            .trim()
            .to_string();
        assert!(
            token.starts_with("tbjoin-"),
            "`tbctl token create` printed no token: {token:?}"
        );
        token
    }

    /// Starts one `tb-nodelet` per Mac in its namespace: named as the Mac, listening on its
    /// management address, joined with `token`, with `--topology topology --probe-port
    /// probe_port`.
    pub fn start_nodelets(&mut self, token: &str, topology: &Path, probe_port: u16) {
        let controller = self.controller_addr().to_string();
        let bin = nodelet_bin();
        // Given as a file (0600), never on a command line.
        let token_file = self.dir.write("join.token", &format!("{token}\n"));
        crate::lab::set_private(&token_file);
        for m in self.macs.clone() {
            let name = m.spec.name.clone();
            let data_dir = self.dir.path().join(&name);
            let args = vec![
                "--controller".to_string(),
                controller.clone(),
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--listen".into(),
                format!("{}:{NODELET_PORT}", m.address),
                "--join-token-file".into(),
                token_file.display().to_string(),
                "--heartbeat-ms".into(),
                HEARTBEAT_MS.to_string(),
                "--port-range".into(),
                format!("{}-{}", RANK_PORTS.0, RANK_PORTS.1),
                "--topology".into(),
                topology.display().to_string(),
                "--probe-port".into(),
                probe_port.to_string(),
                // The binaries may sit where job accounts cannot reach them.
                "--single-user".into(),
            ];
            let args = [args, crate::auth::nodelet_args()].concat();
            self.data_dirs.push(data_dir);
            self.spawn_in(&m.namespace, &name, &bin, args);
        }
    }

    /// Waits until every Mac's Node is Ready.
    pub async fn wait_nodes_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let want: Vec<String> = self.macs.iter().map(|m| m.spec.name.clone()).collect();
        loop {
            for n in &want {
                self.check_running(n);
            }
            let out = self.tbctl(&["get", "nodes", "-o", "json"]).await;
            let ready: Vec<String> = if out.success() {
                items(&out.json())
                    .iter()
                    .filter(|n| {
                        n["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                    })
                    .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            } else {
                Vec::new()
            };
            if want.iter().all(|w| ready.contains(w)) {
                crate::step!("Nodes Ready: {}", ready.join(", "));
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "Nodes not all Ready after {timeout:?}: want {want:?}, Ready {ready:?}; last: {out}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `tbctl --server CONTROLLER --timeout 5s ARGS...` in the hub namespace, with a private
    /// home and no `TB_*` variables; bounded by [`TBCTL_TIMEOUT`].
    pub async fn tbctl(&self, args: &[&str]) -> TbctlOutput {
        let mut full: Vec<String> = vec![
            "--server".into(),
            self.controller_addr().to_string(),
            "--timeout".into(),
            "5s".into(),
        ];
        full.extend(args.iter().map(|a| a.to_string()));
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.hub])
            .arg(crate::bins::tbctl())
            .args(&full)
            .current_dir(&self.home)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TB_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("TB_TOKEN", crate::auth::admin_token());
        cmd.env("TB_CA_CERT", crate::auth::ca_cert());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting `ip netns exec {} tbctl`: {e}", self.hub));
        let output = match tokio::time::timeout(TBCTL_TIMEOUT, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => panic!("waiting for tbctl {}: {e}", full.join(" ")),
            Err(_) => panic!(
                "tbctl {} did not finish within {TBCTL_TIMEOUT:?}",
                full.join(" ")
            ),
        };
        TbctlOutput {
            args: full,
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Like [`EmulatedLab::tbctl`], panicking unless it exits 0.
    pub async fn tbctl_ok(&self, args: &[&str]) -> TbctlOutput {
        let out = self.tbctl(args).await;
        assert!(out.success(), "expected success from {out}");
        out
    }

    /// `tbctl apply -f` a YAML document (written to a file in the test directory).
    pub async fn apply_yaml(&self, yaml: &str) -> TbctlOutput {
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.write(&format!("manifest-{n}.yaml"), yaml);
        let path = path.display().to_string();
        self.tbctl_ok(&["apply", "-f", &path]).await
    }

    /// The API key of InferenceService `service`'s rank 0 endpoint
    /// ([`crate::lab::service_key_in`]), once its nodelet has written it.
    pub async fn service_key(&self, service: &str) -> Option<String> {
        let allocations = self.list("Allocation").await.ok()?;
        crate::lab::service_key_in(&self.data_dirs, &allocations, service)
    }

    /// `tbctl get KIND -o json`'s items, or what tbctl said when it failed.
    pub async fn list(&self, kind: &str) -> Result<Vec<Value>, String> {
        let out = self.tbctl(&["get", kind, "-o", "json"]).await;
        if !out.success() {
            return Err(out.to_string());
        }
        Ok(items(&out.json()))
    }

    // --- failure report and teardown ---------------------------------------------------------

    /// A blocking, bounded tbctl run for the failure report: its output, or why there is none.
    fn report_tbctl(&self, args: &[&str]) -> String {
        let Some(addr) = &self.controller else {
            return "(no controller)".into();
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hub])
            .arg(crate::bins::tbctl())
            .args(["--server", addr, "--timeout", "3s"])
            .args(args)
            .env("TB_TOKEN", crate::auth::admin_token())
            .env("TB_CA_CERT", crate::auth::ca_cert())
            .env("HOME", &self.home)
            .env("NO_COLOR", "1");
        bounded_output(cmd, Duration::from_secs(5))
    }

    fn report(&self) {
        let mut text = String::from("----- emulated lab at failure -----\n");
        for args in [
            &["topology"][..],
            &["get", "nodes", "-o", "wide"],
            &["get", "links", "-o", "wide"],
            &["get", "isvc", "-o", "wide"],
            &["get", "allocs", "-o", "wide"],
        ] {
            text += &format!("$ tbctl {}\n{}\n", args.join(" "), self.report_tbctl(args));
        }
        for ns in &self.namespaces {
            let mut cmd = Command::new("ip");
            cmd.args(["-n", ns, "-br", "addr"]);
            text += &format!(
                "$ ip -n {ns} -br addr\n{}",
                bounded_output(cmd, Duration::from_secs(3))
            );
            let mut cmd = Command::new("tc");
            cmd.args(["-n", ns, "-s", "qdisc", "show"]);
            text += &format!(
                "$ tc -n {ns} -s qdisc show\n{}",
                bounded_output(cmd, Duration::from_secs(3))
            );
        }
        text += &self.partition_report();
        eprintln!("{text}");
        for (ns, p) in &self.procs {
            eprintln!(
                "----- {} (in {ns}) log {} (last {LOG_TAIL_LINES} lines) -----\n{}",
                p.name(),
                p.log_path().display(),
                p.log_tail(LOG_TAIL_LINES)
            );
        }
    }
}

impl Drop for EmulatedLab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.report();
        }
        // Nodelets first (they would restart nothing, but keep the controller busy), then the
        // controller, then what the nodelets started.
        for (_, p) in self.procs.iter_mut().rev() {
            p.kill();
        }
        for d in &self.data_dirs {
            kill_leftover_ranks(d);
        }
        // Anything else still running in the lab's namespaces was started by this lab.
        for ns in &self.namespaces {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .filter(|&p| p > 1 && p != std::process::id() as i32)
                {
                    #[cfg(unix)]
                    // SAFETY: a process inside this lab's own namespace, started by the lab.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
        for line in self.delay_lines.drain(..) {
            line.stop();
        }
        for ns in self.namespaces.iter().rev() {
            match Command::new("ip").args(["netns", "del", ns]).output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "warning: `ip netns del {ns}` failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("warning: `ip netns del {ns}` cannot be run: {e}"),
            }
        }
    }
}

/// `items` of a tbctl JSON list.
fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Runs a command line whose words contain no spaces (split on whitespace), as [`run`].
fn sh(line: &str) -> Output {
    let argv: Vec<&str> = line.split_whitespace().collect();
    run(&argv)
}

/// Runs `argv`, panicking (with the command, its exit status and stderr) unless it exits 0.
fn run(argv: &[&str]) -> Output {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("`{}` cannot be run: {e}", argv.join(" ")));
    if !out.status.success() {
        panic!(
            "`{}` failed ({}): {}{}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    out
}

/// Deletes the namespaces of emulated labs whose test process is gone (`tbe<pid>-...` with
/// `pid` not alive): a test killed mid-run cannot tear its lab down.
fn sweep_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("tbe")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i64>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            eprintln!("deleting namespace {name} left by process {pid}, which is gone");
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness's own client inside a namespace

/// A tokio runtime whose one thread lives in a lab namespace: every socket its tasks open (a
/// [`crate::Client`]'s channels, made on first use inside [`NsRuntime::run`]) is that
/// namespace's, so the test reaches the controllers' addresses as tbctl in the hub does.
/// Stopped, and its thread joined, on drop.
pub struct NsRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsRuntime {
    /// A runtime in namespace `ns` (made by `ip netns add`).
    pub fn start(ns: &str) -> NsRuntime {
        let path = format!("/var/run/netns/{ns}");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("tb-ns-{ns}"))
            .spawn(move || {
                let entered = enter_namespace(&path);
                let rt = entered.and_then(|()| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("building a runtime: {e}"))
                });
                match rt {
                    Ok(rt) => {
                        let _ = ready_tx.send(Ok(rt.handle().clone()));
                        rt.block_on(async {
                            let _ = stop_rx.await;
                        });
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .expect("starting a namespace thread");
        let handle = ready_rx
            .recv()
            .expect("the namespace thread ended")
            .unwrap_or_else(|e| panic!("a runtime in namespace {ns}: {e}"));
        NsRuntime {
            handle,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Runs `f` on the namespace's runtime and returns what it returns (a panic in it is
    /// raised again here, so assertions inside read as usual).
    pub async fn run<F, T>(&self, f: F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match self.handle.spawn(f).await {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a task in a namespace was cancelled: {e}"),
        }
    }

    /// Starts `f` on the namespace's runtime.
    pub fn spawn<F, T>(&self, f: F) -> tokio::task::JoinHandle<T>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.handle.spawn(f)
    }
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Moves the calling thread (only it) into the network namespace at `path`.
#[cfg(target_os = "linux")]
fn enter_namespace(path: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| format!("opening {path}: {e}"))?;
    // SAFETY: setns on a descriptor this thread owns; changes only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn enter_namespace(_path: &str) -> Result<(), String> {
    Err("network namespaces are Linux-only".into())
}

// ---------------------------------------------------------------------------------------------
// Delayed cables: TUN devices and a delay line

/// Copies packets between two TUN devices, each direction held for `delay`: per direction a
/// reader thread stamps each packet with its departure time and a writer thread writes it out
/// then (the delay is the same for every packet, so the order is kept).
struct DelayLine {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl DelayLine {
    #[cfg(target_os = "linux")]
    fn start(
        name: &str,
        a: std::os::fd::OwnedFd,
        b: std::os::fd::OwnedFd,
        delay: Duration,
    ) -> DelayLine {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let stop = Arc::new(AtomicBool::new(false));
        let a = Arc::new(a);
        let b = Arc::new(b);
        let mut threads = Vec::new();
        for (dir, from, to) in [("ab", a.clone(), b.clone()), ("ba", b, a)] {
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            let stop_r = stop.clone();
            let tag = format!("delay {name} {dir}");
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tb-delay-{dir}-r"))
                    .spawn(move || tun::read_loop(&from, &stop_r, delay, tx, &tag))
                    .expect("starting a delay-line thread"),
            );
            let tag = format!("delay {name} {dir}");
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tb-delay-{dir}-w"))
                    .spawn(move || tun::write_loop(&to, rx, &tag))
                    .expect("starting a delay-line thread"),
            );
        }
        DelayLine { stop, threads }
    }

    #[cfg(not(target_os = "linux"))]
    fn start(_name: &str, _a: tun::Fd, _b: tun::Fd, _delay: Duration) -> DelayLine {
        unreachable!("the emulated lab is Linux-only")
    }

    /// Stops both directions and waits for the threads; the TUN devices go with the last
    /// handle on their file descriptors.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(target_os = "linux")]
mod tun {
    use std::fs::{File, OpenOptions};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
    use std::time::{Duration, Instant};

    /// `struct ifreq` with the flags member of its union (40 bytes on 64-bit Linux).
    #[repr(C)]
    struct IfReqFlags {
        name: [libc::c_char; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }

    /// A TUN device (IP packets, no packet-info header) named `name` in network namespace
    /// `ns` (made by `ip netns add`). The device lives as long as the returned descriptor.
    pub fn create_in(ns: &str, name: &str) -> std::io::Result<OwnedFd> {
        assert!(
            name.len() < libc::IFNAMSIZ,
            "interface name {name} is too long"
        );
        let ns_path = format!("/var/run/netns/{ns}");
        let name = name.to_string();
        // A device is made in the network namespace of the thread that opens /dev/net/tun:
        // a short-lived thread enters the namespace for that (setns affects only itself).
        std::thread::scope(|s| {
            s.spawn(move || -> std::io::Result<OwnedFd> {
                let nsf = File::open(&ns_path)?;
                // SAFETY: setns on a descriptor this thread owns; changes only this thread.
                if unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let tun = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open("/dev/net/tun")?;
                let mut req = IfReqFlags {
                    name: [0; libc::IFNAMSIZ],
                    flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
                    _pad: [0; 22],
                };
                for (d, s) in req.name.iter_mut().zip(name.bytes()) {
                    *d = s as libc::c_char;
                }
                // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `req` is laid out as.
                if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(OwnedFd::from(tun))
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the TUN thread panicked")))
        })
    }

    /// Reads packets from `fd` until `stop`, sending each with its departure time.
    pub fn read_loop(
        fd: &OwnedFd,
        stop: &AtomicBool,
        delay: Duration,
        tx: Sender<(Instant, Vec<u8>)>,
        tag: &str,
    ) {
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, owned here.
            let n = unsafe { libc::poll(&mut pfd, 1, 100) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("{tag}: poll: {e}");
                return;
            }
            if n == 0 || pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            // SAFETY: reads into `buf`, whose length is passed.
            let len = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if len < 0 {
                let e = std::io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) {
                    continue;
                }
                eprintln!("{tag}: read: {e}");
                return;
            }
            let at = Instant::now() + delay;
            if tx.send((at, buf[..len as usize].to_vec())).is_err() {
                return;
            }
        }
    }

    /// Writes each packet into `fd` at its departure time, until the reader is gone.
    pub fn write_loop(fd: &OwnedFd, rx: Receiver<(Instant, Vec<u8>)>, tag: &str) {
        let mut errors = 0u32;
        loop {
            let (at, packet) = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(p) => p,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            // SAFETY: writes `packet`, whose length is passed.
            let n = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                // The receiving side may be going away (teardown), or drop what it cannot
                // take; a wire loses such packets too.
                errors += 1;
                if errors <= 3 {
                    eprintln!("{tag}: write: {e}");
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod tun {
    /// Never made: `create_in` always fails off Linux.
    pub struct Fd;

    pub fn create_in(_ns: &str, _name: &str) -> std::io::Result<Fd> {
        Err(std::io::Error::other("TUN devices are Linux-only here"))
    }
}

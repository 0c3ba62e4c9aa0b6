//! tb-collbench: nccl-tests-style benchmark of tb's collectives over its TCP transport, with MLX's
//! ring `all_sum` and a raw loopback socket pair side by side in the same run.
//!
//! `tb-collbench --ranks N [--min 8] [--max 256M] [--iters 20] [--warmup 5] [--op allreduce]
//! [--compare-mlx PYTHON] [--pin] [--check]` spawns N rank processes (this binary with
//! `--rank R --coordinator ADDR`) on 127.0.0.1, sweeps sizes ×2 from `--min` to `--max` bytes, and
//! prints size, count, type, time (µs), algbw = S/t (GB/s), busbw = algbw × 2(n−1)/n for
//! all-reduce ((n−1)/n for all-gather, 1 for broadcast) and #wrong (elements that differ from
//! the exact reference; the data are small integers so every dtype sums exactly).
//!
//! `--check` runs every dtype once per size without timing and exits non-zero on any wrong
//! element (the tests use it with real processes).
//!
//! `--smoke` runs the same measurement path in seconds: every op, 8 B to 64 KiB, a few
//! iterations, and a small raw socket pair (plus MLX if `--compare-mlx` is given); it prints the
//! tables and exits non-zero if any part could not run or any element is wrong.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use half::{bf16, f16};
use tb_transport::collectives::{CollectiveOptions, Communicator};
use tb_transport::select::{Preference, open_endpoints};
use tb_transport::tcp::TcpConfig;
use tb_transport::wire::DType;
use tb_transport::{BufId, Endpoints};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "tb-collbench",
    about = "Benchmark tb's collectives (TCP) against MLX's ring backend",
    // The launcher passes its own flags on to the rank processes and appends `--op` per sweep
    // (--smoke sweeps every op): the last occurrence wins.
    args_override_self = true
)]
struct Args {
    /// Number of ranks (processes on 127.0.0.1).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Smallest message in bytes (K/M/G suffixes: 1024-based).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    min: usize,
    /// Largest message in bytes.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    max: usize,
    /// Timed iterations per size (fewer for sizes where one iteration exceeds ~1/8 of --budget).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Seconds of timed iterations per size at most (large sizes then run fewer iterations).
    #[arg(long, default_value_t = 3.0)]
    budget: f64,
    /// allreduce | allgather | broadcast.
    #[arg(long, default_value = "allreduce")]
    op: String,
    /// float32 | float16 | bfloat16 (the timed sweep; --check does all three).
    #[arg(long, default_value = "float32")]
    dtype: String,
    /// Run MLX's ring all_sum with this Python (mlx installed) over the same sizes (float32).
    #[arg(long)]
    compare_mlx: Option<String>,
    /// Skip the raw socket-pair ceiling.
    #[arg(long)]
    no_raw: bool,
    /// Pin rank r to CPU r mod ncpu (sched_setaffinity).
    #[arg(long)]
    pin: bool,
    /// Correctness only: every dtype, one iteration per size, exit 1 on any wrong element.
    #[arg(long)]
    check: bool,
    /// Quick run of the whole measurement path (seconds): every op, 8 B..64 KiB, 3 iterations,
    /// a 64 MiB raw socket pair; replaces --min/--max/--iters/--warmup/--budget/--op and exits
    /// non-zero if any part could not run.
    #[arg(long)]
    smoke: bool,
    /// TCP sockets per peer.
    #[arg(long, default_value_t = 1)]
    rails: usize,
    /// Pipeline chunk in bytes.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    chunk: usize,
    /// Chunks in flight per ring direction.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// All-reduces of at least this many bytes use both ring directions (3+ ranks).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    bidir_min: usize,
    /// SO_SNDBUF/SO_RCVBUF in bytes (0: kernel auto-tuning).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    sockbuf: usize,
    /// Collective timeout in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// (internal) this process is rank R of a run.
    #[arg(long, hide = true)]
    rank: Option<usize>,
    /// (internal) rank 0's bootstrap address.
    #[arg(long, hide = true)]
    coordinator: Option<SocketAddr>,
}

impl Args {
    /// `--smoke`: tiny sizes, few iterations, a short timeout. The rank processes get the same
    /// flags, so they shrink the same way.
    fn shrink_for_smoke(&mut self) {
        self.min = 8;
        self.max = 64 << 10;
        self.iters = 3;
        self.warmup = 1;
        self.budget = 0.05;
        self.timeout = self.timeout.min(20);
    }

    /// The ops the launcher sweeps, one run of rank processes each.
    fn ops(&self) -> Result<Vec<Op>> {
        if self.smoke {
            Ok(vec![Op::AllReduce, Op::AllGather, Op::Broadcast])
        } else {
            Ok(vec![Op::parse(&self.op)?])
        }
    }

    /// The dtypes each rank runs, in order (--check: all three).
    fn dtypes(&self) -> Result<Vec<DType>> {
        if self.check {
            Ok(vec![DType::F32, DType::F16, DType::BF16])
        } else {
            Ok(vec![parse_dtype(&self.dtype)?])
        }
    }

    /// Bytes the raw socket-pair ceiling moves per direction (one way, both ways at once).
    fn raw_bytes(&self) -> (usize, usize) {
        if self.smoke {
            (64 << 20, 32 << 20)
        } else {
            (2 << 30, 1 << 30)
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|_| format!("expected a size like 8, 64K, 256M, found `{s}`"))
}

fn parse_dtype(s: &str) -> Result<DType> {
    Ok(match s {
        "float32" | "f32" => DType::F32,
        "float16" | "f16" => DType::F16,
        "bfloat16" | "bf16" => DType::BF16,
        _ => bail!("--dtype: expected float32, float16 or bfloat16, found `{s}`"),
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    AllReduce,
    AllGather,
    Broadcast,
}

impl Op {
    fn parse(s: &str) -> Result<Op> {
        Ok(match s {
            "allreduce" | "all_reduce" => Op::AllReduce,
            "allgather" | "all_gather" => Op::AllGather,
            "broadcast" => Op::Broadcast,
            _ => bail!("--op: expected allreduce, allgather or broadcast, found `{s}`"),
        })
    }
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "allreduce",
            Op::AllGather => "allgather",
            Op::Broadcast => "broadcast",
        }
    }
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 13) as f32 - 6.0
}

fn put(dst: &mut [u8], dtype: DType, i: usize, x: f32) {
    match dtype {
        DType::F32 => dst[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes()),
        DType::F16 => dst[2 * i..2 * i + 2].copy_from_slice(&f16::from_f32(x).to_le_bytes()),
        DType::BF16 => dst[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
        DType::U8 => dst[i] = x as u8,
    }
}

fn eq_at(src: &[u8], dtype: DType, i: usize, x: f32) -> bool {
    let mut b = [0u8; 4];
    put(&mut b, dtype, 0, x);
    let es = dtype.size();
    src[es * i..es * i + es] == b[..es]
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = Args::parse();
    if args.smoke {
        args.shrink_for_smoke();
    }
    if args.ranks == 0 || args.ranks > 64 {
        bail!("--ranks must be 1..=64, found {}", args.ranks);
    }
    if args.min > args.max {
        bail!("--min {} is larger than --max {}", args.min, args.max);
    }
    match args.rank {
        Some(rank) => worker(&args, rank),
        None => launcher(&args),
    }
}

/// One rank: open the transport, run the sweep, print `RESULT dtype size count us wrong` lines.
fn worker(args: &Args, rank: usize) -> Result<()> {
    let n = args.ranks;
    let coord = args.coordinator.context("--rank needs --coordinator")?;
    if args.pin {
        pin(rank)?;
    }
    let op = Op::parse(&args.op)?;
    let ep = Endpoints {
        rank,
        world: n,
        peers: vec!["127.0.0.1:0".parse()?; n],
        coordinator: coord,
        connect_timeout: Duration::from_secs(60),
    };
    let cfg = TcpConfig {
        rails: args.rails,
        sockbuf: (args.sockbuf > 0).then_some(args.sockbuf),
        ..TcpConfig::default()
    }
    // Each rank reduces on its own thread.
    .spinning_for(&ep, 1);
    let t = open_endpoints(&ep, Preference::Tcp, cfg)?;
    let mut c = Communicator::new(
        t,
        CollectiveOptions {
            timeout: Duration::from_secs(args.timeout),
            chunk_bytes: args.chunk,
            window: args.window,
            bidirectional_min: args.bidir_min,
        },
    );
    let dtypes = args.dtypes()?;
    let buf = c.transport().register(args.max)?;
    let out = std::io::stdout();
    for dtype in dtypes {
        for size in sizes(args.min, args.max) {
            let (count, us, wrong) = one_size(&mut c, args, op, buf, dtype, size)?;
            let mut o = out.lock();
            writeln!(o, "RESULT {} {size} {count} {us:.3} {wrong}", dtype.name())?;
            o.flush()?;
        }
    }
    c.barrier()?;
    Ok(())
}

/// Fills, runs once and checks, warms up, then times. Returns (count, µs per op, #wrong).
fn one_size(
    c: &mut Communicator,
    args: &Args,
    op: Op,
    buf: BufId,
    dtype: DType,
    size: usize,
) -> Result<(usize, f64, u64)> {
    let (n, rank, es) = (c.world(), c.rank(), dtype.size());
    let count = size / es;
    // Per-rank piece for all-gather (nccl-tests: size is the gathered total).
    let per = (count / n) * es;
    let root = 0;
    let fill = |c: &mut Communicator| {
        let b = c.transport().buf_mut(buf);
        match op {
            Op::AllReduce => (0..count).for_each(|i| put(b, dtype, i, value(rank, i))),
            Op::AllGather => {
                let k = per / es;
                (0..k).for_each(|i| put(b, dtype, rank * k + i, value(rank, i)))
            }
            Op::Broadcast => (0..count).for_each(|i| {
                let x = if rank == root { value(root, i) } else { 0.0 };
                put(b, dtype, i, x)
            }),
        }
    };
    let run = |c: &mut Communicator| -> Result<()> {
        match op {
            Op::AllReduce => c.all_reduce_buf(buf, 0, count, dtype)?,
            Op::AllGather => c.all_gather_buf(buf, 0, per)?,
            Op::Broadcast => c.broadcast_buf(buf, 0, count * es, root)?,
        }
        Ok(())
    };
    fill(c);
    run(c)?;
    let b = c.transport_ref().buf(buf);
    let wrong = match op {
        Op::AllReduce => (0..count)
            .filter(|&i| !eq_at(b, dtype, i, (0..n).map(|r| value(r, i)).sum()))
            .count(),
        Op::AllGather => {
            let k = per / es;
            (0..n * k)
                .filter(|&j| !eq_at(b, dtype, j, value(j / k.max(1), j % k.max(1))))
                .count()
        }
        Op::Broadcast => (0..count)
            .filter(|&i| !eq_at(b, dtype, i, value(root, i)))
            .count(),
    } as u64;
    if args.check {
        return Ok((count, 0.0, wrong));
    }
    for _ in 0..args.warmup {
        run(c)?;
    }
    // One timed probe decides how many iterations fit the budget; rank 0's choice is shared so
    // every rank runs the same number.
    c.barrier()?;
    let t0 = Instant::now();
    run(c)?;
    let one = t0.elapsed().as_secs_f64();
    let mut iters = [0u8; 4];
    if rank == 0 {
        let fit = (args.budget / one.max(1e-9)) as usize;
        iters = (fit.clamp(2, args.iters.max(2)) as u32).to_le_bytes();
    }
    c.broadcast(&mut iters, 0)?;
    let iters = u32::from_le_bytes(iters) as usize;
    c.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        run(c)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    Ok((count, us, wrong))
}

#[cfg(target_os = "linux")]
fn pin(rank: usize) -> Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut set = CpuSet::new();
    set.set(rank % ncpu)?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
    Ok(())
}

/// macOS has no CPU affinity API that binds a thread to a core (only affinity tags): a no-op.
#[cfg(not(target_os = "linux"))]
fn pin(rank: usize) -> Result<()> {
    eprintln!("--pin: CPU pinning is Linux-only; rank {rank} runs unpinned");
    Ok(())
}

#[derive(Default, Clone, Copy)]
struct Row {
    count: usize,
    us: f64,
    wrong: u64,
}

fn launcher(args: &Args) -> Result<()> {
    let n = args.ranks;
    let ops = args.ops()?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_else(|_| "n/a".into());
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "# tb-collbench: op {} ranks {n} on 127.0.0.1, {ncpu} CPUs, load before the run: {}",
        ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(","),
        load.trim()
    );
    println!(
        "# tcp: rails {} sockbuf {} chunk {} window {} bidir-min {} pin {}; iters {} warmup {} budget {}s/size",
        args.rails,
        args.sockbuf,
        args.chunk,
        args.window,
        args.bidir_min,
        args.pin,
        args.iters,
        args.warmup,
        args.budget
    );
    if !args.smoke {
        let op = ops[0];
        let mut raw = None;
        return sweep(args, op, ncpu, &mut raw);
    }
    // --smoke: every part runs even when an earlier one failed; the exit status says whether all
    // of them did.
    let started = Instant::now();
    let mut raw = None;
    let mut failed = Vec::new();
    for &op in &ops {
        println!("# op {}", op.name());
        if let Err(e) = sweep(args, op, ncpu, &mut raw) {
            println!("# op {}: FAILED: {e:#}", op.name());
            failed.push(format!("{}: {e:#}", op.name()));
        }
    }
    if !failed.is_empty() {
        bail!(
            "smoke: {} of {} ops failed: {}",
            failed.len(),
            ops.len(),
            failed.join("; ")
        );
    }
    println!(
        "# smoke: ok, {} ops x {} sizes in {:.1}s",
        ops.len(),
        sizes(args.min, args.max).len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One op: the ranks' sweep, the raw socket-pair ceiling (measured once per run, kept in `raw_cache`),
/// MLX if asked, then the table. Fails on any wrong element, and under --smoke on any size
/// without a result.
fn sweep(args: &Args, op: Op, ncpu: usize, raw_cache: &mut Option<(f64, f64)>) -> Result<()> {
    let n = args.ranks;
    let sizes = sizes(args.min, args.max);
    let tb = run_tb(args, op)?;
    if args.smoke {
        for dtype in args.dtypes()? {
            let rows = tb.iter().find(|(d, _)| d == dtype.name()).map(|(_, r)| r);
            let missing: Vec<usize> = sizes
                .iter()
                .copied()
                .filter(|s| !rows.is_some_and(|r| r.iter().any(|(x, _)| x == s)))
                .collect();
            if !missing.is_empty() {
                bail!("no {} result for sizes {missing:?}", dtype.name());
            }
        }
    }
    let raw = if args.no_raw || args.check {
        None
    } else if let Some(r) = *raw_cache {
        Some(r)
    } else {
        let (one_way, both_ways) = args.raw_bytes();
        let r = (
            raw_socket_pair(args.sockbuf, false, one_way)?,
            raw_socket_pair(args.sockbuf, true, both_ways)?,
        );
        *raw_cache = Some(r);
        Some(r)
    };
    // Under --smoke a failed MLX run still leaves tb's table to print; it fails the op after.
    let mut mlx_failure = None;
    let mlx = match (&args.compare_mlx, op) {
        (Some(py), Op::AllReduce) if !args.check => match run_mlx(py, args, &sizes) {
            Ok(rows) => Some(rows),
            Err(e) if args.smoke => {
                mlx_failure = Some(e);
                None
            }
            Err(e) => return Err(e),
        },
        (Some(_), _) if !args.check && !args.smoke => {
            eprintln!("--compare-mlx: only allreduce is compared (MLX all_sum)");
            None
        }
        _ => None,
    };
    // On loopback every byte costs a kernel copy on the sending and on the receiving rank's CPU.
    // Raw one-way R spends two CPUs on one copy each, so a CPU copies ~R bytes/s. A ring
    // all-reduce copies 4(n-1)/n × S bytes per rank (in and out), so with c = min(ncpu, n) CPUs
    // busbw cannot exceed R × c / (2n) (all-gather and broadcast: half as many copies).
    let ceiling = raw.map(|(one, _)| {
        let copies = if op == Op::AllReduce { 2.0 } else { 1.0 };
        one * (ncpu.min(n) as f64) / (copies * n as f64)
    });
    if let (Some((one, duplex)), Some(ceil)) = (raw, ceiling) {
        println!(
            "# raw loopback socket pair, one TCP connection: {one:.2} GB/s one way (2 threads), \
             {duplex:.2} GB/s per direction both ways at once (4 threads)"
        );
        println!(
            "# loopback CPU ceiling for this op: busbw <= raw x min(ncpu, n) / ({}n) = {ceil:.2} GB/s",
            if op == Op::AllReduce { "2" } else { "" }
        );
    }
    let bf = op.bus_factor(n);
    print!(
        "{:>12} {:>12} {:>9} {:>12} {:>8} {:>8} {:>7}",
        "size(B)", "count", "type", "time(us)", "algbw", "busbw", "#wrong"
    );
    if mlx.is_some() {
        print!(" | {:>12} {:>8} {:>7}", "mlx t(us)", "busbw", "tb/mlx");
    }
    if raw.is_some() {
        print!(" | {:>6} {:>6} {:>6}", "tb/raw", "/duplx", "/ceil");
    }
    println!();
    let mut total_wrong = 0;
    for (dtype, rows) in &tb {
        for &size in &sizes {
            let Some(r) = rows.iter().find(|(s, _)| *s == size).map(|(_, r)| *r) else {
                continue;
            };
            total_wrong += r.wrong;
            let algbw = size as f64 / (r.us * 1e-6) / 1e9;
            let busbw = algbw * bf;
            if args.check {
                println!(
                    "{size:>12} {:>12} {:>9} {:>12} {:>8} {:>8} {:>7}",
                    r.count, dtype, "-", "-", "-", r.wrong
                );
                continue;
            }
            print!(
                "{size:>12} {:>12} {:>9} {:>12.1} {algbw:>8.3} {busbw:>8.3} {:>7}",
                r.count, dtype, r.us, r.wrong
            );
            if let Some(m) = &mlx {
                match m.iter().find(|(s, _)| *s == size) {
                    Some((_, mus)) => {
                        let mb = size as f64 / (mus * 1e-6) / 1e9 * bf;
                        print!(" | {mus:>12.1} {mb:>8.3} {:>6.2}x", busbw / mb);
                    }
                    None => print!(" | {:>12} {:>8} {:>7}", "-", "-", "-"),
                }
            }
            if let (Some((one, duplex)), Some(ceil)) = (raw, ceiling) {
                print!(
                    " | {:>5.0}% {:>5.0}% {:>5.0}%",
                    100.0 * busbw / one,
                    100.0 * busbw / duplex,
                    100.0 * busbw / ceil
                );
            }
            println!();
        }
    }
    if total_wrong > 0 {
        bail!("{total_wrong} wrong elements");
    }
    match mlx_failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

type Table = Vec<(String, Vec<(usize, Row)>)>;

/// Spawns the ranks for `op`, collects their RESULT lines; time is the slowest rank's, #wrong
/// the sum.
fn run_tb(args: &Args, op: Op) -> Result<Table> {
    let n = args.ranks;
    let coord = {
        let l = TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let exe = std::env::current_exe()?;
    let mut children = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .arg("--rank")
            .arg(r.to_string())
            .arg("--coordinator")
            .arg(coord.to_string())
            .arg("--op")
            .arg(op.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        children.push(cmd.spawn().with_context(|| format!("starting rank {r}"))?);
    }
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| c.stdout.take().map(BufReader::new))
        .collect();
    let handles: Vec<_> = readers
        .into_iter()
        .map(|r| {
            std::thread::spawn(move || -> Vec<String> {
                r.map(|r| r.lines().map_while(|l| l.ok()).collect())
                    .unwrap_or_default()
            })
        })
        .collect();
    let outputs: Vec<Vec<String>> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    let mut failed = Vec::new();
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait()?;
        if !st.success() {
            failed.push(format!("rank {r}: {st}"));
        }
    }
    if !failed.is_empty() {
        bail!("ranks failed: {}", failed.join("; "));
    }
    let mut table: Table = Vec::new();
    for lines in outputs {
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 6 || f[0] != "RESULT" {
                continue;
            }
            let (size, count, us, wrong): (usize, usize, f64, u64) =
                (f[2].parse()?, f[3].parse()?, f[4].parse()?, f[5].parse()?);
            let pos = match table.iter().position(|(d, _)| d == f[1]) {
                Some(p) => p,
                None => {
                    table.push((f[1].to_string(), Vec::new()));
                    table.len() - 1
                }
            };
            let rows = &mut table[pos].1;
            match rows.iter_mut().find(|(s, _)| *s == size) {
                Some((_, row)) => {
                    row.us = row.us.max(us);
                    row.wrong += wrong;
                }
                None => rows.push((size, Row { count, us, wrong })),
            }
        }
    }
    Ok(table)
}

/// Raw loopback TCP throughput in GB/s per direction over one connection, `total` bytes each
/// way: `duplex == false`: one thread writes 4 MiB chunks, one reads (the ceiling the brief asks
/// for); `duplex == true`: both ends write and read at once (what a 2-rank ring does with its one
/// socket), the slower direction counts.
fn raw_socket_pair(sockbuf: usize, duplex: bool, total: usize) -> Result<f64> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let chunk = 4 << 20;
    let tune = move |s: &TcpStream| -> Result<()> {
        s.set_nodelay(true)?;
        if sockbuf > 0 {
            let r = socket2::SockRef::from(s);
            r.set_send_buffer_size(sockbuf)?;
            r.set_recv_buffer_size(sockbuf)?;
        }
        Ok(())
    };
    let a = TcpStream::connect(addr)?;
    let (b, _) = l.accept()?;
    tune(&a)?;
    tune(&b)?;
    let read_all = move |mut s: TcpStream| -> Result<f64> {
        let mut buf = vec![0u8; chunk];
        let mut got = 0usize;
        let mut t0 = None;
        while got < total {
            let k = s.read(&mut buf)?;
            if k == 0 {
                bail!("raw: writer closed early");
            }
            t0.get_or_insert_with(Instant::now);
            got += k;
        }
        Ok(t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(1.0))
    };
    let write_all = move |mut s: TcpStream| -> Result<()> {
        let buf = vec![1u8; chunk];
        let mut sent = 0;
        while sent < total {
            s.write_all(&buf)?;
            sent += chunk;
        }
        Ok(())
    };
    let mut readers = vec![{
        let b2 = b.try_clone()?;
        std::thread::spawn(move || read_all(b2))
    }];
    let mut writers = vec![{
        let a2 = a.try_clone()?;
        std::thread::spawn(move || write_all(a2))
    }];
    if duplex {
        let a3 = a.try_clone()?;
        readers.push(std::thread::spawn(move || read_all(a3)));
        let b3 = b.try_clone()?;
        writers.push(std::thread::spawn(move || write_all(b3)));
    }
    for w in writers {
        w.join()
            .map_err(|_| anyhow::anyhow!("raw writer panicked"))??;
    }
    let mut worst: f64 = 0.0;
    for r in readers {
        worst = worst.max(
            r.join()
                .map_err(|_| anyhow::anyhow!("raw reader panicked"))??,
        );
    }
    Ok(total as f64 / worst / 1e9)
}

const MLX_SCRIPT: &str = r#"
import json, sys, time
import mlx.core as mx
sizes, iters, warmup, budget = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
g = mx.distributed.init(strict=True)
r, n = g.rank(), g.size()
for size in sizes:
    count = max(size // 4, 1)
    x = (mx.arange(count, dtype=mx.float32) * 3 + r * 7) % 13 - 6
    mx.eval(x)
    y = mx.distributed.all_sum(x)
    mx.eval(y)
    for _ in range(warmup):
        mx.eval(mx.distributed.all_sum(x))
    mx.eval(mx.distributed.all_sum(x))
    t0 = time.perf_counter()
    mx.eval(mx.distributed.all_sum(x))
    one = time.perf_counter() - t0
    k = max(2, min(iters, int(budget / max(one, 1e-9))))
    k = int(mx.distributed.all_sum(mx.array([k if r == 0 else 0])).item())
    t0 = time.perf_counter()
    for _ in range(k):
        y = mx.distributed.all_sum(x)
        mx.eval(y)
    dt = (time.perf_counter() - t0) / k
    if r == 0:
        print("MLXRESULT " + json.dumps({"size": size, "us": dt * 1e6, "iters": k}), flush=True)
"#;

/// Runs MLX's ring all_sum over the same sizes with `python -m mlx.launch --backend ring`.
fn run_mlx(python: &str, args: &Args, sizes: &[usize]) -> Result<Vec<(usize, f64)>> {
    // The launcher runs in a temp dir: make a relative interpreter path absolute first.
    let python = if python.contains('/') {
        // Not canonicalize: a venv's python is a symlink that must stay as it is.
        std::path::absolute(python)
            .with_context(|| format!("--compare-mlx {python}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        python.to_string()
    };
    let python = python.as_str();
    let dir = std::env::temp_dir().join(format!("tb-collbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("mlx_allsum.py");
    std::fs::write(&script, MLX_SCRIPT)?;
    let sizes_json = format!(
        "[{}]",
        sizes
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    // `mlx.launch` is a console script; run its entry point with the given interpreter.
    let launch = "import sys; from mlx._distributed_utils.launch import main; \
                  sys.argv[0] = 'mlx.launch'; sys.exit(main())";
    let out = Command::new(python)
        .arg("-c")
        .arg(launch)
        .args(["--backend", "ring", "-n", &args.ranks.to_string(), "--"])
        .arg(python)
        .arg(&script)
        .arg(&sizes_json)
        .arg(args.iters.to_string())
        .arg(args.warmup.to_string())
        .arg(args.budget.to_string())
        .current_dir(&dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {python} -m mlx.launch"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for l in text.lines() {
        if let Some(j) = l.split("MLXRESULT ").nth(1) {
            let v: serde_json::Value = serde_json::from_str(j)?;
            if let (Some(s), Some(us)) = (v["size"].as_u64(), v["us"].as_f64()) {
                rows.push((s as usize, us));
            }
        }
    }
    if !out.status.success() || rows.is_empty() {
        bail!(
            "MLX run failed ({}): {}",
            out.status,
            text.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
        );
    }
    Ok(rows)
}

//! The built-in executor: tb's own engine runs a model split across Macs. Each rank of a
//! built-in allocation is a `tb-shard` process (started and supervised like any other rank, so
//! restarts, logs, fencing and gang restarts work the same): it loads only its layers of the
//! GGUF ([`tb_engine::shard::Shard`]), opens the data-plane transport to the other ranks, and
//! serves its stage.
//!
//! - [`messages`]: the steps stages pass over the transport (control + activation tensors);
//! - [`stage`]: ranks ≥ 1 — run the blocks, pass the activation on, sample on the last stage;
//! - [`tensor`]: one stage split across ranks by tensor parallelism (rank 0 drives, the others
//!   follow, partial sums all-reduced over tb-transport);
//! - [`driver`]: rank 0 — requests in, first stage, tokens back into text;
//! - [`openai`]: rank 0's OpenAI-compatible HTTP API;
//! - [`prefix`]: which recent prompts rank 0 keeps, so that requests starting like them skip
//!   that part of the prefill;
//! - [`admission`]: how many requests a service holds before it answers 429;
//! - [`command`]: how the nodelet turns a built-in allocation into a `tb-shard` (or `tb-train`)
//!   command line;
//! - [`train`]: `tb-train`, one rank of a built-in fine-tune (a TrainingJob).

pub mod admission;
pub mod command;
pub mod driver;
pub mod messages;
pub mod observed;
pub mod openai;
pub mod prefix;
pub mod stage;
pub mod tensor;
pub mod train;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tb_engine::chat::ChatTemplate;
use tb_engine::gguf::GgufIndex;
use tb_engine::shard::{LoadOptions, Shard, default_device};
use tb_engine::tokenizer::Tokenizer;

use tb_transport::collectives::{CollectiveOptions, Communicator};
use tb_transport::tcp::TcpConfig;
use tb_transport::{Endpoints, Preference, select};

/// Requests that may wait per running place (`batch`) before the endpoint answers 429.
pub const QUEUE_PER_SLOT: usize = 2;

/// One rank of a built-in service.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    pub model_path: PathBuf,
    /// A LoRA adapter (PEFT directory) applied to this rank's blocks.
    pub adapter: Option<PathBuf>,
    /// The model id the endpoint serves.
    pub model_name: String,
    pub first: usize,
    /// Blocks from `first`; to the model's last when absent.
    pub count: Option<usize>,
    pub rank: usize,
    /// Every rank's data-plane IP, in pipeline order.
    pub hosts: Vec<IpAddr>,
    /// Rank 0's bootstrap coordinator.
    pub coordinator: SocketAddr,
    /// Rank 0 serves HTTP here.
    pub http: Option<SocketAddr>,
    /// The API key its `/v1` endpoints take, in this file (none: any caller).
    pub api_key_file: Option<PathBuf>,
    /// The certificate chain and key (PEM files) rank 0 serves HTTPS with (none: plain HTTP).
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub context: Option<usize>,
    pub batch: usize,
    /// Bytes this rank may use; the shard's weights must fit.
    pub memory_limit: Option<u64>,
    /// How long the ranks may take to find each other (the slowest loads its weights first).
    pub connect_timeout: Duration,
    /// How long one step may take in the later stages.
    pub step_timeout: Duration,
    pub transport: Preference,
    /// The ranks form one stage split by tensor parallelism ([`tensor`]) instead of a pipeline.
    pub tensor_parallel: bool,
    /// Prompts rank 0 keeps for requests that start like them ([`prefix`]; 0: none).
    pub prefix_cache: usize,
    /// Prompt tokens one step prefills at most, across its sequences
    /// ([`driver::PREFILL_PER_STEP`] by default).
    pub prefill_per_step: usize,
}

/// The TLS configuration of rank 0's endpoint from its certificate and key files.
fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<Arc<tokio_rustls::rustls::ServerConfig>> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let what = format!("{} and {}", cert.display(), key.display());
    Ok(tb_api::https::server_config(&cert_pem, &key_pem, &what)?)
}

/// Why a rank could not start: a short CamelCase reason for the allocation status and the
/// message.
#[derive(Debug)]
pub struct StartError {
    pub reason: &'static str,
    pub error: anyhow::Error,
}

fn start_error(reason: &'static str) -> impl FnOnce(anyhow::Error) -> StartError {
    move |error| StartError { reason, error }
}

/// Opens the data-plane transport to the other ranks.
async fn connect(opts: &ShardOptions) -> Result<Communicator, StartError> {
    let ep = Endpoints {
        rank: opts.rank,
        world: opts.hosts.len(),
        peers: opts.hosts.iter().map(|h| SocketAddr::new(*h, 0)).collect(),
        coordinator: opts.coordinator,
        connect_timeout: opts.connect_timeout,
    };
    let want = opts.transport;
    let t = tokio::task::spawn_blocking(move || {
        let tcp = TcpConfig::for_endpoints(&ep, tb_engine::cpu_threads());
        select::open_endpoints(&ep, want, tcp)
    })
    .await
    .map_err(|e| anyhow::anyhow!("transport set-up stopped: {e}"))
    .and_then(|r| r.map_err(anyhow::Error::from))
    .context("connecting the service's ranks")
    .map_err(start_error("TransportFailed"))?;
    Ok(Communicator::new(t, CollectiveOptions::default()))
}

/// How a rank ≥ 1 (a later stage or a tensor-parallel follower) ended.
fn stage_ended(
    served: Result<Result<(), tb_transport::TransportError>, tokio::task::JoinError>,
) -> Result<(), StartError> {
    match served {
        Ok(Ok(())) => Ok(()),
        // The rank before or after went away: said so, so that the scheduler blames the rank
        // (or Mac) that did.
        Ok(Err(e)) if e.is_peer_loss() => Err(StartError {
            reason: "PeerLost",
            error: anyhow::Error::from(e).context("serving the stage"),
        }),
        Ok(Err(e)) => Err(StartError {
            reason: "StageFailed",
            error: anyhow::Error::from(e).context("serving the stage"),
        }),
        Err(e) => Err(StartError {
            reason: "StageFailed",
            error: anyhow::anyhow!("stage stopped: {e}"),
        }),
    }
}

/// Loads this rank's shard and opens the transport; then serves until shut down or broken.
pub async fn run(opts: ShardOptions) -> Result<(), StartError> {
    let world = opts.hosts.len();
    if world == 0 || opts.rank >= world {
        return Err(StartError {
            reason: "InvalidSpec",
            error: anyhow::anyhow!("rank {} of {} hosts", opts.rank, world),
        });
    }
    // Before the model loads, so that a bad key or certificate file is said at once.
    let api_key = opts
        .api_key_file
        .as_deref()
        .map(openai::read_key_file)
        .transpose()
        .map_err(start_error("InvalidSpec"))?;
    let tls = opts
        .tls_files
        .as_ref()
        .map(|(cert, key)| tls_config(cert, key))
        .transpose()
        .map_err(start_error("InvalidSpec"))?;
    let path = opts.model_path.clone();
    let (first, count, context) = (opts.first, opts.count, opts.context);
    let adapter = opts.adapter.clone();
    let rank = opts.rank;
    // Tensor parallel: the shard's all-reduces need the transport as it loads.
    let tp_comm: Option<tensor::SharedComm> = if opts.tensor_parallel && world > 1 {
        // Whether the model splits this way, before waiting for the other ranks.
        GgufIndex::open(&path)
            .map_err(anyhow::Error::from)
            .and_then(|index| {
                tb_engine::tp::TensorParallel::new(rank, world)?.slice(index.config())?;
                Ok(())
            })
            .with_context(|| format!("splitting {} over {world} ranks", path.display()))
            .map_err(start_error("InvalidSpec"))?;
        Some(Arc::new(std::sync::Mutex::new(connect(&opts).await?)))
    } else {
        None
    };
    let tp_load = tp_comm.clone();
    let loaded = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let index = GgufIndex::open(&path)?;
        let load = LoadOptions {
            max_context: context,
            adapter,
            ..LoadOptions::default()
        };
        let count = count.unwrap_or_else(|| index.config().n_layers.saturating_sub(first));
        let shard = match tp_load {
            Some(comm) => Shard::tensor_parallel_from_index(
                &index,
                first,
                count,
                &load,
                &default_device(),
                tb_engine::tp::TensorParallel::new(rank, world)?,
                Box::new(tensor::TransportAllReduce::new(comm)),
            )?,
            None => Shard::from_index(&index, first, count, &load, &default_device())?,
        };
        let extras = if rank == 0 {
            Some((
                Tokenizer::from_gguf(index.content())?,
                ChatTemplate::from_gguf(index.content())?,
            ))
        } else {
            None
        };
        Ok((shard, extras))
    })
    .await
    .map_err(|e| anyhow::anyhow!("loading stopped: {e}"))
    .and_then(|r| r)
    .map_err(start_error("ModelLoadFailed"))?;
    let (shard, extras) = loaded;
    if let Some(limit) = opts.memory_limit
        && shard.weight_bytes() > limit
    {
        return Err(StartError {
            reason: "ShardTooBig",
            error: anyhow::anyhow!(
                "blocks {}..{} of {} need {} bytes of weights in memory, but this rank's \
                 allocation reserves {limit}",
                shard.first(),
                shard.first() + shard.count(),
                opts.model_path.display(),
                shard.weight_bytes()
            ),
        });
    }
    tracing::info!(
        rank,
        first,
        count = shard.count(),
        weights = shard.weight_bytes(),
        "shard loaded"
    );

    let comm = if world > 1 && tp_comm.is_none() {
        Some(connect(&opts).await?)
    } else {
        None
    };

    if rank > 0
        && let Some(comm) = tp_comm.clone()
    {
        let mut shard = shard;
        let followed = tokio::task::spawn_blocking(move || tensor::follow(&comm, &mut shard)).await;
        return stage_ended(followed);
    }
    if rank > 0 {
        let Some(mut comm) = comm else {
            return Err(StartError {
                reason: "InvalidSpec",
                error: anyhow::anyhow!("a later stage without a pipeline"),
            });
        };
        let mut shard = shard;
        let step_timeout = opts.step_timeout;
        let served =
            tokio::task::spawn_blocking(move || stage::serve(&mut comm, &mut shard, step_timeout))
                .await;
        return stage_ended(served);
    }

    let Some((tokenizer, template)) = extras else {
        return Err(StartError {
            reason: "InvalidSpec",
            error: anyhow::anyhow!("rank 0 without a tokenizer"),
        });
    };
    let Some(http) = opts.http else {
        return Err(StartError {
            reason: "InvalidSpec",
            error: anyhow::anyhow!("rank 0 needs an HTTP address"),
        });
    };
    // What the allocation's memory leaves after the weights, for the KV caches (rank 0's
    // stage stands for every stage: their shares of the blocks are alike).
    let kv_budget = opts
        .memory_limit
        .map(|limit| limit.saturating_sub(shard.weight_bytes()));
    let health = Arc::new(driver::Health::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let api = Arc::new(openai::Api {
        api_key,
        requests: std::sync::Mutex::new(tx),
        tokenizer: tokenizer.clone(),
        template,
        model: opts.model_name.clone(),
        context: shard.context(),
        health: health.clone(),
        observed: Default::default(),
        admission: admission::Admission::new(opts.batch, opts.batch.max(1) * QUEUE_PER_SLOT),
        started: chrono::Utc::now().timestamp(),
    });
    let listener = tokio::net::TcpListener::bind(http)
        .await
        .with_context(|| format!("binding the endpoint {http}"))
        .map_err(start_error("EndpointUnavailable"))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(endpoint = %format!("{scheme}://{http}/v1"), "serving the OpenAI-compatible API");
    let drv = driver::Driver {
        comm,
        followers: tp_comm.map(tensor::Followers::new),
        shard,
        tokenizer,
        batch: opts.batch,
        kv_budget,
        step_timeout: opts.step_timeout,
        prefixes: prefix::PrefixCache::new(opts.prefix_cache),
        prefill_per_step: opts.prefill_per_step,
    };
    let driver_health = health.clone();
    let driver = tokio::task::spawn_blocking(move || drv.run(rx, driver_health));
    let app = openai::router(api);
    let server = async move {
        match tls {
            Some(config) => {
                axum::serve(tb_api::https::TlsListener::new(listener, config), app).await
            }
            None => axum::serve(listener, app).await,
        }
    };
    tokio::select! {
        r = server => r.context("the HTTP server stopped").map_err(start_error("EndpointFailed")),
        r = driver => {
            // Let clients read the 503s of the failed requests before the process goes.
            tokio::time::sleep(Duration::from_millis(300)).await;
            match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(driver::PipelineError::PeerLost(m))) => Err(StartError {
                    reason: "PeerLost",
                    error: anyhow::anyhow!(m),
                }),
                Ok(Err(driver::PipelineError::Own(m))) => Err(StartError {
                    reason: "StageFailed",
                    error: anyhow::anyhow!(m),
                }),
                Err(e) => Err(StartError {
                    reason: "StageFailed",
                    error: anyhow::anyhow!("the pipeline stopped: {e}"),
                }),
            }
        }
    }
}

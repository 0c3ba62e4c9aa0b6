//! Test fixtures: objects of each kind that together set every spec field, and a helper that lists the
//! field paths of a JSON value.

use serde_json::Value;

use crate::kind::Kind;
use crate::object::Object;
use crate::validate::validate_object;

/// A fully populated object of `kind`, validated and normalised.
pub(crate) fn full_object(kind: Kind) -> Object {
    parse(kind, full_yaml(kind))
}

/// Every example of `kind`: the full one, and for kinds whose fields exclude each other (a
/// built-in TrainingJob's `finetune` against an exec one's `command`) the others, so that
/// together they set every field.
pub(crate) fn full_objects(kind: Kind) -> Vec<Object> {
    let builtin = [
        parse(Kind::TrainingJob, BUILTIN_TRAINING_JOB),
        // epochs instead of steps.
        parse(
            Kind::TrainingJob,
            &BUILTIN_TRAINING_JOB
                .replace("steps: 600", "epochs: 3")
                .replace("warmupSteps: 20", "warmupSteps: 0"),
        ),
        // The dataset on one Node, staged to the other ranks.
        parse(
            Kind::TrainingJob,
            &BUILTIN_TRAINING_JOB.replace(
                "dataset: data/facts.jsonl",
                "dataset: /data/facts.jsonl\n    datasetNode: mac-studio-1",
            ),
        ),
    ];
    let mut all = vec![full_object(kind)];
    match kind {
        Kind::TrainingJob => all.extend(builtin),
        Kind::InferenceService => all.extend(ADAPTER_SERVICES.iter().map(|y| parse(kind, y))),
        Kind::Schedule => {
            for job in builtin {
                let mut schedule = full_object(kind);
                schedule.spec["jobTemplate"]["spec"] = job.spec;
                all.push(validate_object(&schedule).unwrap_or_else(|e| panic!("{kind}: {e}")));
            }
        }
        _ => {}
    }
    all
}

fn parse(kind: Kind, yaml: &str) -> Object {
    let obj: Object = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{kind}: {e}"));
    validate_object(&obj).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

/// A built-in fine-tune with every `finetune` field set.
const BUILTIN_TRAINING_JOB: &str = r#"
apiVersion: tb/v1
kind: TrainingJob
metadata: {name: lora}
spec:
    model: smollm2
    dataset: data/facts.jsonl
    executor: builtin
    ranks: 2
    finetune:
        method: lora
        lora: {rank: 8, alpha: 16, dropout: 0.05, targets: [q, k, v, o, gate, up, down]}
        steps: 600
        batchSize: 8
        sequenceLength: 512
        learningRate: 0.0002
        warmupSteps: 20
        schedule: cosine
        weightDecay: 0.01
        gradClip: 1.0
        accumulation: 2
        seed: 7
        evalEvery: 50
        evalFraction: 0.1
        output: adapters/facts
"#;

/// Services naming an adapter: by path on a node, and by the fine-tune that writes it (the
/// two exclude each other).
const ADAPTER_SERVICES: [&str; 2] = [
    r#"
apiVersion: tb/v1
kind: InferenceService
metadata: {name: tuned, namespace: lab}
spec:
  model: smollm2
  executor: builtin
  adapter: {path: /Users/Shared/adapters/zorbania, node: mac-studio-1}
"#,
    r#"
apiVersion: tb/v1
kind: InferenceService
metadata: {name: tuned, namespace: lab}
spec:
  model: smollm2
  adapter: {trainingJob: zorbania}
"#,
];

/// Paths of every field in `v`, not descending into maps whose keys are data (labels, env...).
pub(crate) fn json_paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
    const DATA_MAPS: [&str; 5] = [
        "env",
        "nodeSelector",
        "hyperparameters",
        "labels",
        "annotations",
    ];
    if let Value::Object(map) = v {
        for (k, child) in map {
            let path = format!("{prefix}.{k}");
            if !DATA_MAPS.contains(&k.as_str()) {
                json_paths(&path, child, out);
            }
            out.push(path);
        }
    }
}

fn full_yaml(kind: Kind) -> &'static str {
    match kind {
        Kind::Model => {
            r#"
apiVersion: tb/v1
kind: Model
metadata: {name: smollm2, labels: {family: smollm}}
spec:
  format: gguf
  source: {path: /models/smollm2.gguf, nodes: [mac-1, mac-2]}
  architecture: llama
  layers: 30
  bytesPerLayer: 3Mi
  totalBytes: 98Mi
  hiddenSize: 576
  heads: 9
  kvHeads: 3
  contextLength: 8192
  vocabSize: 49152
  headDim: 64
  kvLoraRank: 512
  qkRopeHeadDim: 64
  slidingWindow: 4096
  slidingWindowLayers: 15
  experts: 8
  expertsPerToken: 2
  activeBytes: 40Mi
  tiedEmbeddings: true
"#
        }
        Kind::InferenceService => {
            r#"
apiVersion: tb/v1
kind: InferenceService
metadata: {name: chat, namespace: lab}
spec:
  model: smollm2
  parallelism: pipeline
  nodes: {min: 2, max: 4}
  context: 2048
  batch: 4
  executor: exec
  command: [mlx_lm.server]
  env: {LOG: debug}
  memory: 8Gi
  endpoint: {port: 8080}
  nodeSelector: {chip: m4-pro}
  queue: serving
  priority: 10
  objective: throughput
"#
        }
        Kind::TrainingJob => {
            r#"
apiVersion: tb/v1
kind: TrainingJob
metadata: {name: finetune}
spec:
    model: smollm2
    dataset: /Users/Shared/data/chat
    hyperparameters: {learningRate: 0.0001, steps: 600}
    executor: exec
    command: ["python3", "-m", "mlx_lm.lora", "--train"]
    env: {HF_HOME: /Users/Shared/hf}
    workingDir: /Users/Shared/work
    ranks: 2
    memory: 48Gi
    backend: jaccl-ring
    parallelism: data
    backoffLimit: 2
    activeDeadlineSeconds: 7200
    ttlSecondsAfterFinished: 86400
    checkpoints: {dir: /Users/Shared/ckpt, everySteps: 100}
    nodeSelector: {chip: m3-ultra}
    queue: research
    priority: 5
    exclusive: true
"#
        }
        Kind::Schedule => {
            r#"
apiVersion: tb/v1
kind: Schedule
metadata: {name: nightly}
spec:
  schedule: "0 2 * * *"
  timeZone: Europe/Paris
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: 600
  suspend: false
  successfulJobsHistoryLimit: 5
  failedJobsHistoryLimit: 2
  jobTemplate:
    metadata: {labels: {team: ml}, annotations: {owner: ana}}
    spec:
      model: smollm2
      dataset: /Users/Shared/data/chat
      hyperparameters: {learningRate: 0.0001, steps: 600}
      executor: exec
      command: ["python3", "-m", "mlx_lm.lora", "--train"]
      env: {HF_HOME: /Users/Shared/hf}
      workingDir: /Users/Shared/work
      ranks: 2
      memory: 48Gi
      backend: jaccl-ring
      parallelism: data
      backoffLimit: 2
      activeDeadlineSeconds: 7200
      ttlSecondsAfterFinished: 86400
      checkpoints: {dir: /Users/Shared/ckpt, everySteps: 100}
      nodeSelector: {chip: m3-ultra}
      queue: research
      priority: 5
      exclusive: true
"#
        }
        Kind::Queue => {
            r#"
apiVersion: tb/v1
kind: Queue
metadata: {name: research}
spec:
  quota: {memory: 1Ti, macs: 8}
  priority: 10
  maxPriority: 20
  preemption: {withinNamespace: Never, otherNamespaces: LowerPriority}
  weight: 2
  namespaces: [research, lab]
  borrowingLimit: {memory: 256Gi, macs: 2}
  fairShareHalfLife: 1h
"#
        }
        Kind::Node => {
            r#"
apiVersion: tb/v1
kind: Node
metadata: {name: mac-studio-1, labels: {chip: m3-ultra}}
spec:
  unschedulable: true
  address: mac-studio-1.local:7443
  taints: ["gpu=busy:NoSchedule"]
"#
        }
        Kind::Link => {
            r#"
apiVersion: tb/v1
kind: Link
metadata: {name: mac-studio-1.en3.mac-studio-2.en5}
spec:
  a: {node: mac-studio-1, port: tb3, interface: en3, address: 192.168.10.1, rdmaDevice: rdma_en3}
  b: {node: mac-studio-2, port: tb5, interface: en5, address: 192.168.10.2, rdmaDevice: rdma_en5}
  nominalGbps: 80
  rdma: true
  probeRequest: 2
"#
        }
        Kind::Allocation => {
            r#"
apiVersion: tb/v1
kind: Allocation
metadata: {name: finetune-e1-r0, labels: {tb/job: finetune, tb/node: mac-studio-1}}
spec:
  job: {kind: TrainingJob, name: finetune, uid: 0a1b2c3d}
  node: mac-studio-1
  desired: run
  rank: 0
  worldSize: 2
  epoch: 1
  memoryBytes: 1073741824
  executor: exec
  command: [python3, train.py]
  env: {OMP_NUM_THREADS: "4"}
  workingDir: work
  stopGraceSeconds: 30
  mlx:
    backend: jaccl
    hosts: ["10.0.0.1:32323", "10.0.0.2:32323"]
    coordinator: "10.0.0.1:32323"
    ibvDevices: [[null, rdma_en3], [rdma_en3, null]]
  layers: {first: 0, count: 40}
  builtin:
    model: llama
    modelPath: /models/llama.gguf
    hosts: [10.0.0.1, 10.0.0.2]
    coordinator: "10.0.0.1:32400"
    endpointPort: 8000
    context: 4096
    batch: 4
    sources: ["10.0.0.1:7602"]
    replicate: true
    tensorParallel: true
    dataset: data/facts.jsonl
    datasetSource: "10.0.0.1:7602"
    finetune: {}
    adapter: {path: /Users/Shared/adapters/zorbania, source: "10.0.0.1:7602"}
"#
        }
        Kind::Event => {
            r#"
apiVersion: tb/v1
kind: Event
metadata: {name: finetune.1}
spec:
  type: Warning
  reason: BackOff
  message: rank 1 exited with status 1
  involvedObject: {kind: TrainingJob, namespace: default, name: finetune, uid: "1234"}
  count: 2
  firstTimestamp: "2026-01-01T02:00:00Z"
  lastTimestamp: "2026-01-01T02:05:00Z"
  source: nodelet/mac-studio-1
"#
        }
    }
}

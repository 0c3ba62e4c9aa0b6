//! The field documentation behind `tbctl explain`, one table per kind, kept in the order the
//! types declare their fields. Laid out one field per line, so rustfmt leaves it alone.

use crate::kind::Kind;

/// One documented field: name, type as shown to users, requirement or default, description.
pub(super) struct Field {
    pub name: &'static str,
    pub ty: &'static str,
    pub note: &'static str,
    pub doc: &'static str,
    pub fields: &'static [Field],
}

/// A field without sub-fields.
const fn f(name: &'static str, ty: &'static str, note: &'static str, doc: &'static str) -> Field {
    Field { name, ty, note, doc, fields: &[] }
}

/// A field that is itself a mapping of documented fields.
const fn obj(name: &'static str, ty: &'static str, note: &'static str, doc: &'static str, fields: &'static [Field]) -> Field {
    Field { name, ty, note, doc, fields }
}

const METADATA: &[Field] = &[
    f("name", "string", "required", "Unique within the kind (and namespace): lower-case letters, digits, '-' and '.'."),
    f("namespace", "string", "default \"default\"", "The namespace of a namespaced kind; Node and Queue have none."),
    f("labels", "map[string]string", "", "Key/value pairs for selecting objects (tbctl get -l app=web)."),
    f("annotations", "map[string]string", "", "Free-form notes for people and tools; not used for selection."),
    f("uid", "string", "set by tb", "Unique for the lifetime of the object."),
    f("resourceVersion", "integer", "set by tb", "Changes on every write; send it back to update only if nothing changed since."),
    f("generation", "integer", "set by tb", "Bumped when the spec changes."),
    f("creationTimestamp", "string", "set by tb", "When the object was created (RFC 3339)."),
];

const CONDITION: &[Field] = &[
    f("type", "string", "", "What is reported, e.g. Ready, Scheduled, Complete, Failed."),
    f("status", "string", "", "True, False or Unknown."),
    f("reason", "string", "", "A CamelCase cause, for programs."),
    f("message", "string", "", "A sentence, for people."),
    f("lastTransitionTime", "string", "", "When status last changed (RFC 3339)."),
];

const STATUS: &[Field] = &[
    f("observedGeneration", "integer", "set by tb", "The metadata.generation this status describes."),
    obj("conditions", "[]Condition", "set by tb", "Observations about the object, latest state of each type.", CONDITION),
];

const MODEL_SOURCE: &[Field] = &[
    f("path", "string", "", "A file or directory every listed node can read; ~ is the nodelet's home."),
    f("nodes", "[]string", "", "Names of the Nodes that hold the weights (all nodes, when empty)."),
];

const MODEL: &[Field] = &[
    f("format", "string", "required", "gguf, mlx or safetensors."),
    obj("source", "ModelSource", "required", "Where the weights are: source.path and/or source.nodes.", MODEL_SOURCE),
    f("architecture", "string", "", "Model family, e.g. llama, qwen3, deepseek2."),
    f("layers", "integer", "", "Transformer blocks; placement splits these across Macs."),
    f("bytesPerLayer", "quantity", "", "Weight bytes of one block, e.g. 3Gi."),
    f("totalBytes", "quantity", "", "Weight bytes in all, e.g. 98Mi or 1.2Ti."),
    f("hiddenSize", "integer", "", "Width of the hidden state; sizes the activations passed between Macs."),
    f("heads", "integer", "", "Attention heads."),
    f("kvHeads", "integer", "", "Key/value heads (fewer than heads with grouped-query attention); sizes the KV cache."),
    f("contextLength", "integer", "", "Longest context the model supports, in tokens."),
    f("vocabSize", "integer", "", "Tokens in the vocabulary."),
];

const NODE_RANGE: &[Field] = &[
    f("min", "integer", "default 1", "The fewest Macs to use."),
    f("max", "integer", "", "The most Macs to use (no limit when absent)."),
];

const ENDPOINT: &[Field] = &[
    f("port", "integer", "", "TCP port of the OpenAI-compatible endpoint, 1-65535 (tb picks one when absent)."),
];

const EXECUTOR_DOC: &str = "builtin (tb's engine runs the model) or exec (tb runs command).";

const INFERENCE_SERVICE: &[Field] = &[
    f("model", "string", "required", "Name of the Model to serve, in the same namespace."),
    f("parallelism", "string", "default auto", "pipeline (layers split along a chain of Macs), tensor (every layer split; needs RDMA) or auto."),
    obj("nodes", "NodeRange", "default {min: 1}", "How many Macs the service may span.", NODE_RANGE),
    f("context", "integer", "", "Tokens of context to reserve KV-cache memory for (the model's full context when absent)."),
    f("batch", "integer", "", "Concurrent sequences to reserve KV-cache memory for."),
    f("executor", "string", "default builtin", EXECUTOR_DOC),
    f("command", "[]string", "required with exec", "Program and arguments to run on each Mac (exec only); found as a TrainingJob's command is."),
    f("env", "map[string]string", "", "Extra environment variables; TB_* are set by tb."),
    f("memory", "quantity", "", "Memory each rank needs (exec only; built-in services are sized from the Model)."),
    obj("endpoint", "Endpoint", "", "Where the service listens.", ENDPOINT),
    f("nodeSelector", "map[string]string", "", "Only place on Nodes carrying all these labels."),
    f("queue", "string", "", "The Queue whose quota this service counts against."),
    f("priority", "integer", "default: the queue's priority", "Order within the queue; higher first, may preempt lower. At most the queue's maxPriority (0 outside a queue); a higher value is refused at apply."),
    f("objective", "string", "default latency", "What placement optimises: latency or throughput."),
];

const CHECKPOINTS: &[Field] = &[
    f("dir", "string", "required", "Directory the job saves checkpoints in and resumes from."),
    f("everySteps", "integer", "", "Save every this many steps."),
];

const TRAINING_JOB: &[Field] = &[
    f("model", "string", "required with builtin", "Name of the Model to train, in the same namespace."),
    f("dataset", "string", "", "A path or URL the program understands."),
    f("hyperparameters", "map[string]any", "", "Passed to the program (builtin: learning rate, steps, ...)."),
    f("executor", "string", "default exec", EXECUTOR_DOC),
    f("command", "[]string", "required with exec", "Program and arguments each rank runs. `python` and `python3` run the nodelet's --python (TB_PYTHON) when it has one, else the first on the PATH (env.PATH, else the nodelet's). A relative program or script (`python3 train.py`) is looked for in the working directory, then in the directory of the manifest `tbctl apply -f` read (annotation tb/manifest-dir) if the Mac has that directory; a rank that finds it nowhere fails with ExecNotFound, listing every path tried."),
    f("env", "map[string]string", "", "Extra environment variables; TB_RANK, TB_WORLD_SIZE and the other TB_* are set by tb."),
    f("workingDir", "string", "", "Directory the command runs in, and the first place a relative program or script is looked for. Absolute: used as is (a single-user nodelet makes it; under per-namespace accounts it must exist and be enterable by the job's account). Relative: made under the rank's own work dir (no '..'). Default: that work dir (the rank's HOME) under the nodelet's data dir."),
    f("ranks", "integer", "default 1", "Processes started together, all or none (gang scheduling)."),
    f("memory", "quantity", "", "Memory each rank needs, e.g. 48Gi."),
    f("backend", "string", "default ring", "MLX distributed backend: ring (TCP), jaccl (RDMA, fully connected) or jaccl-ring (RDMA ring)."),
    f("parallelism", "string", "default data", "data (each rank holds the model), pipeline (ranks hold consecutive layers) or auto."),
    f("backoffLimit", "integer", "default 3", "Retries before the job is marked Failed."),
    f("activeDeadlineSeconds", "integer", "", "Stop the job and mark it Failed after this long."),
    f("ttlSecondsAfterFinished", "integer", "", "Delete the finished job after this long."),
    obj("checkpoints", "Checkpoints", "", "Where and how often the job saves progress.", CHECKPOINTS),
    f("nodeSelector", "map[string]string", "", "Only place ranks on Nodes carrying all these labels."),
    f("queue", "string", "", "The Queue whose quota this job counts against."),
    f("priority", "integer", "default: the queue's priority", "Order within the queue; higher first, may preempt lower. At most the queue's maxPriority (0 outside a queue); a higher value is refused at apply."),
    f("exclusive", "boolean", "default false", "Give each rank a Mac of its own."),
];

const TEMPLATE_METADATA: &[Field] = &[
    f("labels", "map[string]string", "", "Labels for each TrainingJob created."),
    f("annotations", "map[string]string", "", "Annotations for each TrainingJob created."),
];

const JOB_TEMPLATE: &[Field] = &[
    obj("metadata", "TemplateMetadata", "", "Labels and annotations for the jobs.", TEMPLATE_METADATA),
    obj("spec", "TrainingJobSpec", "required", "The spec of each TrainingJob created.", TRAINING_JOB),
];

const SCHEDULE: &[Field] = &[
    f("schedule", "string", "required", "Cron: minute hour day-of-month month day-of-week (\"0 2 * * *\"), or @hourly, @daily, @weekly, @monthly, @yearly."),
    f("timeZone", "string", "", "IANA time zone the schedule is read in, e.g. Europe/Paris (the controller's when absent)."),
    f("concurrencyPolicy", "string", "default Allow", "When a run is due and the last is still going: Allow, Forbid (skip) or Replace."),
    f("startingDeadlineSeconds", "integer", "", "Skip a run that could not start within this many seconds of its time."),
    f("suspend", "boolean", "default false", "Create no new runs while true."),
    f("successfulJobsHistoryLimit", "integer", "default 3", "Finished jobs to keep."),
    f("failedJobsHistoryLimit", "integer", "default 1", "Failed jobs to keep."),
    obj("jobTemplate", "JobTemplate", "required", "The TrainingJob to create at each run.", JOB_TEMPLATE),
];

const QUOTA: &[Field] = &[
    f("memory", "quantity", "", "Unified memory, summed over the running ranks (unlimited when absent)."),
    f("macs", "integer", "", "Macs in use (unlimited when absent)."),
];

const QUEUE_PREEMPTION: &[Field] = &[
    f("withinNamespace", "string", "default LowerPriority", "LowerPriority: a pending job may stop running gangs of strictly lower priority in its own namespace; Never: it may not."),
    f("otherNamespaces", "string", "default Never", "LowerPriority: a pending job may also stop lower-priority gangs of other namespaces; Never: it may not. Reclaiming borrowed capacity is not limited by this."),
];

const QUEUE: &[Field] = &[
    obj("quota", "QueueQuota", "", "What the queue's running work may hold at once.", QUOTA),
    f("priority", "integer", "default 0", "Queues with higher priority are served first and may preempt lower ones; the priority of the queue's jobs that name none."),
    f("maxPriority", "integer", "default: priority", "The highest spec.priority a job of this queue may ask for; a higher one is refused at apply, and a job stored before the ceiling was lowered is scheduled at the ceiling. Must be at least priority. A job in no queue may ask for at most 0."),
    obj("preemption", "QueuePreemption", "", "Whose running work the queue's pending jobs may preempt.", QUEUE_PREEMPTION),
    f("weight", "integer", "default 1", "Share of idle capacity relative to other queues."),
    f("namespaces", "[]string", "", "Namespaces whose work may use this queue (any, when empty)."),
    obj("borrowingLimit", "QueueQuota", "", "How far beyond quota the queue may borrow idle capacity (none when absent).", QUOTA),
    f("fairShareHalfLife", "duration", "", "How quickly past usage is forgotten in fair sharing, e.g. 1h or 7d."),
];

const NODE: &[Field] = &[
    f("unschedulable", "boolean", "default false", "Cordoned: running work stays, nothing new is placed (tbctl cordon)."),
    f("address", "string", "", "Where the nodelet can be reached: host or host:port."),
    f("taints", "[]string", "", "Marks (key=value:Effect) that keep work off this Mac."),
];

const OBJECT_REF: &[Field] = &[
    f("kind", "string", "required", "Kind of the object."),
    f("namespace", "string", "", "Its namespace (none for cluster-scoped kinds)."),
    f("name", "string", "required", "Its name."),
    f("uid", "string", "", "Its uid, telling apart objects that had the same name."),
];

const EVENT: &[Field] = &[
    f("type", "string", "default Normal", "Normal or Warning."),
    f("reason", "string", "required", "A short CamelCase cause, e.g. Scheduled, BackOff, NodeLost."),
    f("message", "string", "", "What happened, for people."),
    obj("involvedObject", "ObjectRef", "required", "The object the event is about.", OBJECT_REF),
    f("count", "integer", "default 1", "How many times it happened."),
    f("firstTimestamp", "string", "", "First time (RFC 3339)."),
    f("lastTimestamp", "string", "", "Latest time (RFC 3339)."),
    f("source", "string", "", "The component that saw it, e.g. scheduler or nodelet/mac-studio-1."),
];

const JOB_REF: &[Field] = &[
    f("kind", "string", "required", "TrainingJob or InferenceService."),
    f("name", "string", "required", "The job's name (same namespace)."),
    f("uid", "string", "", "The job's uid, telling apart jobs that reused a name."),
];

const MLX_ASSIGNMENT: &[Field] = &[
    f("backend", "string", "required", "ring, jaccl or jaccl-ring."),
    f("hosts", "[]string", "required", "ip:port each rank listens on, in rank order (= ring order)."),
    f("coordinator", "string", "", "Rank 0's ip:port for JACCL."),
    f("ibvDevices", "[][]string", "", "JACCL's device matrix: row i, column j = RDMA device on rank i cabled to rank j."),
];

const LAYER_RANGE: &[Field] = &[
    f("first", "integer", "required", "The first layer held, from 0."),
    f("count", "integer", "required", "How many consecutive layers."),
];

const ALLOCATION: &[Field] = &[
    obj("job", "JobRef", "required", "The job this rank belongs to.", JOB_REF),
    f("node", "string", "required", "The Node that runs it."),
    f("rank", "integer", "required", "This rank, from 0."),
    f("worldSize", "integer", "required", "How many ranks the job has."),
    f("epoch", "integer", "required", "Which placement of the job this is; bumped on every restart or re-placement."),
    f("desired", "string", "default run", "run or stop: a nodelet stops processes whose allocation says stop or is gone."),
    f("memoryBytes", "integer", "", "Memory reserved on the node."),
    f("executor", "string", "required", "builtin or exec."),
    f("command", "[]string", "", "The process to run (exec)."),
    f("env", "map[string]string", "", "Environment beyond the TB_* and MLX_* variables tb sets."),
    f("workingDir", "string", "", "The job's workingDir: absolute, or relative to the allocation's work dir."),
    obj("mlx", "MlxAssignment", "", "The MLX distributed setup computed by the scheduler.", MLX_ASSIGNMENT),
    obj("layers", "LayerRange", "", "The model layers this rank holds, when placement split a model.", LAYER_RANGE),
    f("stopGraceSeconds", "integer", "default 10", "Seconds between SIGTERM and SIGKILL."),
];

const LINK_END: &[Field] = &[
    f("node", "string", "required", "The Mac at this end."),
    f("port", "string", "required", "The port's name on that Mac (tb3, or the name a topology file gives it)."),
    f("interface", "string", "", "The port's network interface (en3)."),
    f("address", "string", "", "The IPv4 address on that interface, where probes and data go."),
    f("rdmaDevice", "string", "", "The RDMA device on the port (rdma_en3) when RDMA is on."),
];

const LINK: &[Field] = &[
    obj("a", "LinkEnd", "required", "The end whose nodelet probes the link.", LINK_END),
    obj("b", "LinkEnd", "required", "The other end.", LINK_END),
    f("nominalGbps", "number", "", "The speed the ports negotiated, Gb/s."),
    f("rdma", "boolean", "default false", "RDMA devices on both ends."),
    f("probeRequest", "integer", "default 0", "Raised by tbctl topology probe to have the link measured again."),
];

/// What each kind is for, and its spec.
pub(super) fn kind_doc(kind: Kind) -> (&'static str, &'static [Field]) {
    match kind {
        Kind::Model => ("Where a model's weights are and its shape, which placement uses to split it across Macs.", MODEL),
        Kind::InferenceService => ("Serves a Model on one or more Macs behind an OpenAI-compatible endpoint; re-placed when a Mac fails.", INFERENCE_SERVICE),
        Kind::TrainingJob => ("Runs ranks of a program together to completion (fine-tuning); all ranks or none.", TRAINING_JOB),
        Kind::Schedule => ("Creates TrainingJobs from a template on a cron schedule.", SCHEDULE),
        Kind::Queue => ("A share of the cluster with a quota, a priority, a fair-share weight and the priority policy of its jobs (maxPriority, preemption). Cluster-scoped; written by admins.", QUEUE),
        Kind::Node => ("One Mac, registered by its nodelet, which reports capacity and links in status. Cluster-scoped.", NODE),
        Kind::Link => ("A cable between two Macs, joined from the ports their nodelets report; the status holds measured bandwidth and latency. Cluster-scoped.", LINK),
        Kind::Event => ("Something that happened to an object, written by tb.", EVENT),
        Kind::Allocation => ("One rank of a job placed on one Mac; created by the scheduler, run by that Mac's nodelet.", ALLOCATION),
    }
}

/// The fields every kind has, with the kind's own spec.
pub(super) fn top_level(kind: Kind) -> [Field; 5] {
    let spec = kind_doc(kind).1;
    [
        f("apiVersion", "string", "required", "Always tb/v1."),
        f("kind", "string", "required", "The kind of object, as named above."),
        obj("metadata", "ObjectMeta", "required", "Name, namespace, labels and annotations; the rest is set by tb.", METADATA),
        obj("spec", "object", "", "What you want.", spec),
        obj("status", "object", "set by tb", "What tb observes; written by tb's components, not by users.", STATUS),
    ]
}

//! Where an exec rank runs and where its program is found: an absolute or a relative
//! `workingDir` (with the MLX hostfile written either way), a relative script found beside the
//! manifest `tbctl apply -f` read, a missing one reported with every path tried, and a 2-rank
//! gang spread over two Macs when one Mac has far more memory free than the others.

use std::time::Duration;

use serde_json::Value;
use tb_tests::lab::{Lab, LabOptions, rank_lines};
use tb_tests::step;

const TIMEOUT: Duration = Duration::from_secs(30);

fn job(name: &str, ranks: u32, extra: &str, command: &str) -> String {
    format!(
        "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  ranks: {ranks}
  memory: 32Mi
  backoffLimit: 0
  activeDeadlineSeconds: 60
{extra}  command: {command}
"
    )
}

/// Every rank of a job that ran prints `pwd` and whether its MLX hostfile is there.
async fn assert_ran_in(lab: &Lab, name: &str, want_dir: &str) {
    let status = lab.wait_job_phase(name, "Succeeded", TIMEOUT).await;
    step!("{name}: {status}");
    let out = lab.tbctl_ok(&["logs", name]).await;
    for rank in 0..2 {
        let lines = rank_lines(&out.stdout, rank);
        assert_eq!(
            lines,
            [want_dir.to_string(), "hostfile ok".to_string()],
            "rank {rank}: {out}"
        );
    }
}

/// `workingDir` absolute (made when missing, single-user) or relative (under the allocation's
/// work dir): the rank runs there, and still gets its hostfile in the allocation dir.
#[tokio::test]
async fn absolute_and_relative_working_dirs_work() {
    let lab = Lab::start("exec-workdir", 1).await;
    let report = r#"["/bin/sh", "-c", "pwd; test -s \"$MLX_HOSTFILE\" && echo hostfile ok"]"#;
    let absolute = lab.dir().join("shared").join("run");
    let abs = absolute.display().to_string();
    lab.apply_yaml(&job("abs", 2, &format!("  workingDir: {abs}\n"), report))
        .await;
    assert_ran_in(&lab, "abs", &abs).await;

    lab.apply_yaml(&job("rel", 2, "  workingDir: out/run\n", report))
        .await;
    lab.wait_job_phase("rel", "Succeeded", TIMEOUT).await;
    let allocs = lab.allocations("rel").await;
    let name = allocs[0]["metadata"]["name"].as_str().expect("name");
    let want = lab
        .nodelet(0)
        .alloc_dir("default", name)
        .join("work/out/run");
    let out = lab.tbctl_ok(&["logs", "rel", "--rank", "0"]).await;
    assert!(
        out.stdout.lines().any(|l| l == want.display().to_string()),
        "rank 0 should run in {}: {out}",
        want.display()
    );
}

/// The same under per-namespace accounts: an absolute `workingDir` the job's account may enter
/// (an isolated nodelet does not create it), and a relative one made under the work dir.
#[tokio::test]
async fn working_dirs_work_under_job_accounts() {
    use std::os::unix::fs::PermissionsExt;
    let lab = Lab::start_with(
        "exec-workdir-isolated",
        LabOptions {
            isolated: true,
            ..LabOptions::new(1)
        },
    )
    .await;
    let report = r#"["/bin/sh", "-c", "pwd; test -s \"$MLX_HOSTFILE\" && echo hostfile ok"]"#;
    let absolute = lab.dir().join("open");
    std::fs::create_dir_all(&absolute).expect("mkdir");
    std::fs::set_permissions(&absolute, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let abs = absolute.display().to_string();
    lab.apply_yaml(&job("abs", 2, &format!("  workingDir: {abs}\n"), report))
        .await;
    assert_ran_in(&lab, "abs", &abs).await;
    lab.apply_yaml(&job("rel", 2, "  workingDir: out\n", report))
        .await;
    let status = lab.wait_job_phase("rel", "Succeeded", TIMEOUT).await;
    step!("rel: {status}");
}

/// A relative script is found beside the manifest it was applied from; a missing one fails
/// the rank before it starts, naming every path tried in its log and its condition.
#[tokio::test]
async fn a_relative_script_is_found_beside_the_manifest() {
    let lab = Lab::start("exec-relative", 1).await;
    let project = lab.dir().join("project");
    std::fs::create_dir_all(project.join("scripts")).expect("mkdir");
    std::fs::write(
        project.join("scripts/hello.sh"),
        "echo \"hello from $0 as rank $TB_RANK\"\n",
    )
    .expect("script");
    let manifest = project.join("hello.yaml");
    std::fs::write(
        &manifest,
        job("hello", 1, "", r#"["sh", "scripts/hello.sh"]"#)
            + "---\n"
            + &job("missing", 1, "", r#"["sh", "scripts/missing.sh"]"#),
    )
    .expect("manifest");
    let file = manifest.display().to_string();
    lab.tbctl_ok(&["apply", "-f", &file]).await;

    let job_obj = lab.try_job("hello").await.expect("job");
    let recorded = job_obj["metadata"]["annotations"]["tb/manifest-dir"].clone();
    assert_eq!(
        recorded,
        Value::from(
            project
                .canonicalize()
                .expect("canonical")
                .display()
                .to_string()
        ),
        "tbctl apply -f records the manifest's directory"
    );
    lab.wait_job_phase("hello", "Succeeded", TIMEOUT).await;
    let out = lab.tbctl_ok(&["logs", "hello"]).await;
    let script = project
        .canonicalize()
        .expect("canonical")
        .join("scripts/hello.sh");
    assert!(
        out.stdout
            .contains(&format!("hello from {} as rank 0", script.display())),
        "{out}"
    );

    let status = lab.wait_job_phase("missing", "Failed", TIMEOUT).await;
    let allocs = lab.allocations("missing").await;
    let a = &allocs[0];
    let work = lab
        .nodelet(0)
        .alloc_dir("default", a["metadata"]["name"].as_str().expect("name"))
        .join("work");
    let tried = [
        work.join("scripts/missing.sh"),
        project
            .canonicalize()
            .expect("canonical")
            .join("scripts/missing.sh"),
    ];
    let message = a["status"]["message"].as_str().unwrap_or_default();
    step!("missing: {message}; job {status}");
    assert_eq!(a["status"]["reason"], "ExecNotFound", "{a:#}");
    let out = lab.tbctl(&["logs", "missing"]).await;
    for path in &tried {
        let path = path.display().to_string();
        assert!(message.contains(&path), "{path} in {message:?}");
        assert!(out.stdout.contains(&path), "{path} in the log: {out}");
    }
    assert!(
        status.to_string().contains("scripts/missing.sh"),
        "the job says why: {status:#}"
    );
}

/// Three idle Macs, one with far more memory free (63Gi against 22Gi): a 2-rank gang gets two
/// Macs, not two slots on the roomiest.
#[tokio::test]
async fn a_gang_spreads_over_idle_macs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let topology = dir.path().join("lab.yaml");
    std::fs::write(
        &topology,
        "macs:
  - {name: node-1, memory: 72Gi, ports: [{name: lo, address: 127.0.3.1}]}
  - {name: node-2, memory: 30Gi, ports: [{name: lo, address: 127.0.3.2}]}
  - {name: node-3, memory: 30Gi, ports: [{name: lo, address: 127.0.3.3}]}
",
    )
    .expect("lab file");
    let mut opts = LabOptions::new(3);
    opts.topology = Some(topology);
    let lab = Lab::start_with("exec-spread", opts).await;
    lab.apply_yaml(&job("pair", 2, "", r#"["sleep", "30"]"#))
        .await;
    lab.wait_job_phase("pair", "Running", TIMEOUT).await;
    let mut nodes: Vec<String> = lab
        .allocations("pair")
        .await
        .iter()
        .map(|a| a["spec"]["node"].as_str().expect("node").to_string())
        .collect();
    step!("pair placed on {nodes:?}");
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "one rank per Mac: {nodes:?}");
}

//! The web dashboard in a real browser: a lab of one controller and three nodelets cabled in a
//! ring, and
//! tests/py/dashboard.py driving Debian's `chromium` through Playwright for Python. An admin
//! signs in and sees the Mac; the test applies a short job, which the page shows appearing and
//! succeeding (told by the change stream, not by polling) with its logs and the loss curve its
//! log lines draw; a viewer's delete is
//! refused in the page (403) and the job is still there; a member sees the job of its own
//! namespace and not another namespace's. The lab picture is saved to
//! `target/test-artifacts/dashboard-lab.png`, and the page's weight and first contentful paint
//! are printed (`DASHBOARD-METRICS {...}` in the test's output).
//!
//! The browser and Playwright must be there (CI installs them: `.ci/run`, `scripts/test.sh`).
//! Without them the test fails, unless `TB_TEST_ALLOW_NO_BROWSER=1` says a machine without a
//! browser may skip it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tb_tests::lab::{Lab, LabOptions, workspace_root};
use tb_tests::step;
use tb_tests::workdir::TestDir;

const JOB: &str = "team-a/hello";
const HIDDEN_JOB: &str = "team-b/hidden";
/// The browser script's own deadlines are 90 s per step; this bounds the whole run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

const TOPOLOGY: &str = "macs:
  - {name: node-1, chip: Apple M2 Ultra, ports: [{name: tb1, address: 127.0.5.1, rdmaDevice: rdma_en1}, {name: tb2, address: 127.0.5.2}]}
  - {name: node-2, chip: Apple M4 Max, ports: [{name: tb1, address: 127.0.5.3, rdmaDevice: rdma_en1}, {name: tb2, address: 127.0.5.4}]}
  - {name: node-3, chip: Apple M4 Pro, ports: [{name: tb1, address: 127.0.5.5}, {name: tb2, address: 127.0.5.6}]}
links:
  - {between: [node-1/tb1, node-2/tb1], bandwidthGbps: 80, latencyUs: 5, rdma: true}
  - {between: [node-2/tb2, node-3/tb1], bandwidthGbps: 40, latencyUs: 10}
  - {between: [node-3/tb2, node-1/tb2], bandwidthGbps: 40, latencyUs: 10}
";

fn job_yaml(namespace: &str, name: &str, text: &str) -> String {
    format!(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
  namespace: {namespace}
spec:
  ranks: 1
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "echo {text}; for i in 1 2 3 4; do echo step $i train loss 2.$((5-i)); done; sleep 1"]
"#
    )
}

/// The Python with Playwright: `$TB_TEST_PYTHON`, else the workspace's `.venv`.
fn python() -> PathBuf {
    std::env::var_os("TB_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv").join("bin").join("python"))
}

/// Whether the browser and Playwright are there; when not, the test fails unless the
/// environment allows skipping (returns false then).
fn browser_ready(chromium: &Path, python: &Path) -> bool {
    let playwright = std::process::Command::new(python)
        .args(["-c", "import playwright.sync_api"])
        .stdin(Stdio::null())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let missing: Vec<String> = [
        (!chromium.exists()).then(|| {
            format!(
                "{} (apt-get install chromium; or set TB_TEST_CHROMIUM)",
                chromium.display()
            )
        }),
        (!playwright).then(|| {
            format!(
                "Playwright in {} (pip install playwright)",
                python.display()
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        return true;
    }
    let allowed = std::env::var("TB_TEST_ALLOW_NO_BROWSER").is_ok_and(|v| v == "1");
    assert!(
        allowed,
        "the dashboard test needs a browser: missing {}. Set TB_TEST_ALLOW_NO_BROWSER=1 to skip it \
         on a machine without one (CI installs both).",
        missing.join(" and ")
    );
    eprintln!(
        "SKIPPED dashboard::a_user_watches_a_job_in_the_browser: missing {} (TB_TEST_ALLOW_NO_BROWSER=1)",
        missing.join(" and ")
    );
    false
}

/// The token a `tbctl admin user create` printed.
fn token_of(out: &tb_tests::TbctlOutput) -> String {
    let t = out.stdout.trim().to_string();
    assert!(t.starts_with("tbuser-") && !t.contains('\n'), "{out}");
    t
}

#[tokio::test]
async fn a_user_watches_a_job_in_the_browser() {
    let chromium = std::env::var_os("TB_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let python = python();
    if !browser_ready(&chromium, &python) {
        return;
    }
    // Three Macs on this host, cabled in a ring by loopback addresses (the nodelets measure
    // the loopback: the picture shows measured figures).
    let dir = TestDir::new("dashboard-topology");
    let topology = dir.write("lab.yaml", TOPOLOGY);
    let mut opts = LabOptions::new(3);
    opts.topology = Some(topology);
    let lab = Lab::start_with("dashboard", opts).await;
    let url = format!("https://{}/ui/", lab.services_addr());
    step!("dashboard at {url}");
    let viewer = token_of(
        &lab.tbctl_ok(&["admin", "user", "create", "vic", "--role", "viewer"])
            .await,
    );
    let member = token_of(
        &lab.tbctl_ok(&[
            "admin", "user", "create", "mia", "--role", "member", "-n", "team-a",
        ])
        .await,
    );
    // A job the member must not see.
    lab.apply_yaml(&job_yaml("team-b", "hidden", "not for team-a"))
        .await;

    let ready_file = lab.dir().join("signed-in");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let screenshot = target.join("test-artifacts").join("dashboard-lab.png");
    let _ = std::fs::remove_file(&screenshot);
    let log = lab.dir().join("browser.log");
    let script = workspace_root()
        .join("tests")
        .join("py")
        .join("dashboard.py");
    let mut browser = tokio::process::Command::new(&python)
        .arg(&script)
        .env("DASH_URL", &url)
        .env("DASH_ADMIN_TOKEN", tb_tests::auth::admin_token())
        .env("DASH_VIEWER_TOKEN", &viewer)
        .env("DASH_MEMBER_TOKEN", &member)
        .env("DASH_CHROMIUM", &chromium)
        .env("DASH_READY_FILE", &ready_file)
        .env("DASH_JOB", JOB)
        .env("DASH_HIDDEN_JOB", HIDDEN_JOB)
        .env("DASH_SCREENSHOT", &screenshot)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("browser log"))
        .kill_on_drop(true)
        .spawn()
        .expect("starting the browser script");
    let stdout = browser.stdout.take().expect("stdout");
    let output = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        let mut stdout = stdout;
        let _ = stdout.read_to_string(&mut text).await;
        text
    });

    // Once the admin's page is live, the job is applied: the page must see it arrive.
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    while !ready_file.exists() {
        if let Ok(Some(status)) = browser.try_wait() {
            panic!(
                "the browser script exited ({status}) before signing in:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the browser never signed in");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    step!("signed in; applying {JOB}");
    lab.apply_yaml(&job_yaml(
        "team-a",
        "hello",
        "hello from the dashboard test",
    ))
    .await;

    let status = tokio::time::timeout(SCRIPT_TIMEOUT, browser.wait())
        .await
        .expect("the browser script finished in time")
        .expect("waiting for the browser script");
    let stdout = output.await.unwrap_or_default();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "the browser script failed ({status}):\n{stdout}\n{stderr}"
    );
    let metrics = stdout
        .lines()
        .find_map(|l| l.strip_prefix("DASHBOARD-METRICS "))
        .unwrap_or_else(|| panic!("no metrics line in:\n{stdout}"));
    println!("dashboard metrics: {metrics}");
    let metrics: serde_json::Value = serde_json::from_str(metrics).expect("metrics JSON");
    assert!(
        metrics["page_weight_bytes"].as_u64().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert!(
        metrics["first_contentful_paint_ms"].as_f64().is_some(),
        "{metrics}"
    );
    assert!(
        std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 0),
        "no screenshot at {}",
        screenshot.display()
    );
    println!("lab picture: {}", screenshot.display());

    // The viewer's refused delete left the job in place.
    let jobs = lab.list("TrainingJob", "team-a").await.expect("list");
    assert!(
        jobs.iter().any(|j| j["metadata"]["name"] == "hello"),
        "{jobs:#?}"
    );
}

//! Node identity and tokens in transit, end to end against the real binaries:
//! - a join token joins once (`--uses N`: N times); a second use is refused with its reason and
//!   the first node stays Ready;
//! - a join under an existing Node's name is refused and the live nodelet keeps heartbeating;
//!   only a token made with `--node NAME` replaces it, and the old credential then stops working;
//! - no process started by the harness or by `tbctl up` carries a token on its command line;
//! - tbctl and tb-nodelet refuse to send a token without a CA unless told `--insecure`, before
//!   anything is sent;
//! - the controller's data dir is 0700 and its files 0600, corrected at start.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::{HeartbeatRequest, JoinRequest};
use tb_tests::Tbctl;
use tb_tests::lab::{Lab, nodelet_bin, set_private};
use tonic::Code;

/// A Node object as a nodelet registers it.
fn node_json(name: &str) -> String {
    json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": name},
           "spec": {"address": "127.0.0.1:1"}, "status": {}})
    .to_string()
}

/// `Nodes.Join` over TLS, as a nodelet does it (anonymous, with the token in the request).
async fn join(addr: &str, token: &str, name: &str) -> Result<String, tonic::Status> {
    let channel = tb_tests::client::tls_endpoint(addr)
        .connect()
        .await
        .expect("connecting");
    NodesClient::new(channel)
        .join(JoinRequest {
            token: token.into(),
            node_json: node_json(name),
            protocol_version: Some(tb_api::version::PROTOCOL),
        })
        .await
        .map(|r| r.into_inner().credential)
}

async fn heartbeat(addr: &str, name: &str, credential: &str) -> Result<(), tonic::Status> {
    let channel = tb_tests::client::tls_endpoint(addr)
        .connect()
        .await
        .expect("connecting");
    NodesClient::new(channel)
        .heartbeat(HeartbeatRequest {
            node: name.into(),
            credential: credential.into(),
            status_json: "{}".into(),
            protocol_version: Some(tb_api::version::PROTOCOL),
        })
        .await
        .map(drop)
}

async fn token(lab: &Lab, extra: &[&str]) -> String {
    let args = [&["token", "create"], extra].concat();
    let t = lab.tbctl_ok(&args).await.stdout.trim().to_string();
    assert!(t.starts_with("tbjoin-"), "{t:?}");
    t
}

fn heartbeat_time(node: &Value) -> String {
    node["status"]["lastHeartbeatTime"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Wait until node `name` heartbeats again after `after` (a lastHeartbeatTime) and is Ready.
async fn wait_fresh_heartbeat(lab: &Lab, name: &str, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let node = lab.node(name).await.expect("node");
        let ready = tb_tests::lab::condition(&node["status"], "Ready") == Some("True");
        if ready && heartbeat_time(&node).as_str() > after {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not heartbeat after {after}: {node}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Run a nodelet that must exit on its own; its exit code and stderr.
fn run_nodelet_to_exit(args: &[String], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(nodelet_bin());
    cmd.env(
        tb_tests::ENGINE_CALIBRATION.0,
        tb_tests::ENGINE_CALIBRATION.1,
    );
    cmd.args(args)
        .env_remove("TB_JOIN_TOKEN")
        .env_remove("TB_CA_CERT")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("starting tb-nodelet");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let out = child.wait_with_output().expect("output");
            return (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tb-nodelet {args:?} did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nodelet_args(controller: &str, name: &str, data_dir: &Path) -> Vec<String> {
    vec![
        "--controller".into(),
        controller.into(),
        "--name".into(),
        name.into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen".into(),
        tb_tests::ports::free_addr(),
        "--probe-port".into(),
        "0".into(),
    ]
}

#[tokio::test]
async fn join_tokens_are_single_use_and_a_joined_name_is_kept() {
    let lab = Lab::start("identity-join", 1).await;
    let addr = lab.addr().to_string();

    // The lab's token (one use, for its one nodelet) is spent: a real nodelet is told so.
    let spent = lab.dir().join("join.token");
    let (code, stderr) = run_nodelet_to_exit(
        &[
            nodelet_args(&addr, "late", &lab.dir().join("late")),
            vec![
                "--join-token-file".into(),
                spent.display().to_string(),
                "--ca-cert".into(),
                tb_tests::auth::ca_cert().display().to_string(),
            ],
        ]
        .concat(),
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(stderr.contains("join token already used"), "{stderr}");
    assert!(
        lab.node("late").await.is_none(),
        "no Node for a refused join"
    );
    lab.wait_node_ready("node-1", true, Duration::from_secs(10))
        .await;

    // --uses 2: two joins, not three.
    let two = token(&lab, &["--uses", "2"]).await;
    join(&addr, &two, "a").await.expect("first use");
    join(&addr, &two, "b").await.expect("second use");
    let third = join(&addr, &two, "c").await.expect_err("third use");
    assert_eq!(third.code(), Code::Unauthenticated, "{third:?}");
    assert!(third.message().contains("all 2 of its joins"), "{third:?}");

    // A fresh token cannot take node-1's name; node-1 keeps heartbeating with its credential.
    let before = heartbeat_time(&lab.node("node-1").await.expect("node-1"));
    let fresh = token(&lab, &[]).await;
    let taken = join(&addr, &fresh, "node-1").await.expect_err("name taken");
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert!(
        taken.message().contains(
            "node node-1 already joined; to replace a reinstalled Mac create a token with \
             `tbctl token create --node node-1`"
        ),
        "{taken:?}"
    );
    wait_fresh_heartbeat(&lab, "node-1", &before).await;
    // The refused join spent nothing: the token still joins a new name.
    join(&addr, &fresh, "d").await.expect("unspent token");

    // A token for another node cannot join as node-1.
    let for_x = token(&lab, &["--node", "x"]).await;
    let wrong = join(&addr, &for_x, "node-1").await.expect_err("bound to x");
    assert_eq!(wrong.code(), Code::PermissionDenied, "{wrong:?}");
    assert!(
        wrong.message().contains("for node x, not node-1"),
        "{wrong:?}"
    );

    // The token made for node-1 replaces it: the old credential stops working.
    let old: Value = serde_json::from_str(
        &std::fs::read_to_string(lab.nodelet(0).data_dir.join("credential.json"))
            .expect("credential"),
    )
    .expect("credential json");
    let old = old["credential"].as_str().expect("credential").to_string();
    heartbeat(&addr, "node-1", &old)
        .await
        .expect("the live credential works");
    let replace = token(&lab, &["--node", "node-1"]).await;
    let new = join(&addr, &replace, "node-1").await.expect("replacing");
    let refused = heartbeat(&addr, "node-1", &old)
        .await
        .expect_err("old credential");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    heartbeat(&addr, "node-1", &new)
        .await
        .expect("the new credential works");
}

/// The command lines (`/proc/*/cmdline`) that name `dir` (their data dirs are under it).
fn command_lines_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&bytes).replace('\0', " ");
        if line.contains(&dir) {
            found.push(format!("{}: {line}", name.to_string_lossy()));
        }
    }
    found
}

#[tokio::test]
async fn no_token_on_any_command_line() {
    // The harness's lab: the join token went to the nodelet in a file.
    let lab = Lab::start("identity-cmdline", 2).await;
    let join_token = std::fs::read_to_string(lab.dir().join("join.token")).expect("token");
    let admin = tb_tests::auth::admin_token();
    let needles = [join_token.trim(), admin, "tbjoin-", "tbuser-", "tbnode-"];
    let lines = command_lines_under(lab.dir());
    assert!(lines.len() >= 3, "controller and nodelets: {lines:?}");
    let hits: Vec<&String> = lines
        .iter()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .collect();
    assert!(hits.is_empty(), "tokens on command lines: {hits:?}");

    // `tbctl up`: every token it makes (tbuser-, tbjoin-) and every node credential (tbnode-).
    let home = lab.dir().join("up-home");
    std::fs::create_dir_all(&home).expect("home");
    let data = lab.dir().join("up");
    let port = tb_tests::ports::free_up_port().to_string();
    let _rank_ports = tb_tests::ports::default_rank_ports().await;
    let up = |args: &[&str]| {
        let mut cmd = std::process::Command::new(tb_tests::bins::tbctl());
        cmd.env(
            tb_tests::ENGINE_CALIBRATION.0,
            tb_tests::ENGINE_CALIBRATION.1,
        );
        cmd.args(args)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env_remove("TB_TOKEN")
            .env_remove("TB_CA_CERT")
            .env_remove("TB_SERVER");
        tb_tests::lab::bounded_output(cmd, Duration::from_secs(60))
    };
    let data_arg = data.display().to_string();
    let out = up(&[
        "up",
        "--nodelets",
        "2",
        "--data-dir",
        &data_arg,
        "--port",
        &port,
    ]);
    assert!(out.contains("local cluster up"), "{out}");
    let lines = command_lines_under(&data);
    let down = up(&["down", "--data-dir", &data_arg]);
    assert_eq!(lines.len(), 3, "the controller and two nodelets: {lines:?}");
    let hits: Vec<&String> = lines
        .iter()
        .filter(|l| {
            ["tbjoin-", "tbuser-", "tbnode-"]
                .iter()
                .any(|n| l.contains(n))
        })
        .collect();
    assert!(hits.is_empty(), "tokens on command lines: {hits:?}");
    assert!(!down.contains("error"), "{down}");
    // The controller of `tbctl up` keeps its data dir private too.
    assert_private(&data.join("controller"));
}

/// The data dir is 0700 and every file in it 0600.
fn assert_private(dir: &Path) {
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(dir), 0o700, "{}", dir.display());
    let mut files = 0;
    for e in std::fs::read_dir(dir).expect("data dir").flatten() {
        if e.file_type().expect("type").is_file() {
            files += 1;
            assert_eq!(mode(&e.path()), 0o600, "{}", e.path().display());
        }
    }
    assert!(files > 0, "{} holds no files", dir.display());
}

#[tokio::test]
async fn tokens_never_go_in_clear_text_without_insecure() {
    let lab = Lab::start("identity-insecure", 1).await;
    let expected = |addr: &str| {
        format!(
            "no CA configured for https://{addr}: pass --ca-cert FILE (a controller's \
             DATA_DIR/ca.pem), set TB_CA_CERT, or `tbctl login --ca-cert FILE`; --insecure \
             sends the token in clear text"
        )
    };

    // A TLS controller, tbctl with a token and no CA: refused with where to get the CA.
    let no_ca = Tbctl::new(&[lab.addr().to_string()], &lab.dir().join("no-ca-home")).with_ca(None);
    let out = no_ca.run(&["get", "nodes"]).await;
    assert_ne!(out.code, Some(0), "{out}");
    assert!(out.stderr.contains(&expected(lab.addr())), "{out}");

    // Before anything is sent: a listener sees no connection at all.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let trap = listener.local_addr().expect("addr").to_string();
    let home = lab.dir().join("trap-home");
    let out = Tbctl::new(std::slice::from_ref(&trap), &home)
        .with_ca(None)
        .run(&["get", "nodes"])
        .await;
    assert!(out.stderr.contains(&expected(&trap)), "{out}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("tbctl connected without a CA: {other:?}"),
    }

    // A controller run with --insecure: tbctl needs --insecure (flag or context) to call it.
    let dir = lab.dir().join("insecure");
    std::fs::create_dir_all(&dir).expect("dir");
    let data = dir.join("data");
    // A data dir left with loose modes is corrected at start.
    std::fs::create_dir_all(&data).expect("data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let addr = tb_tests::ports::free_addr();
    let log = dir.join("controller.log");
    let mut controller = tb_tests::lab::Proc::start(
        "insecure-controller",
        &tb_tests::bins::controller(),
        vec![
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--insecure".into(),
        ],
        log,
    );
    let token_file = data.join("admin.token");
    let deadline = Instant::now() + Duration::from_secs(30);
    let admin = loop {
        if let Ok(t) = std::fs::read_to_string(&token_file)
            && t.ends_with('\n')
        {
            break t;
        }
        assert!(
            controller.exit_status().is_none(),
            "controller exited: {}",
            controller.log()
        );
        assert!(
            Instant::now() < deadline,
            "no admin token: {}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let plain = Tbctl::new(std::slice::from_ref(&addr), &dir.join("home"))
        .with_ca(None)
        .with_token(Some(admin.trim()));
    let out = plain.run(&["get", "nodes"]).await;
    assert!(out.stderr.contains(&expected(&addr)), "{out}");
    plain
        .run(&["--insecure", "get", "nodes"])
        .await
        .expect_code(0);
    // Kept in the context by `tbctl login --insecure`.
    let login = dir.join("login.token");
    std::fs::write(&login, &admin).expect("write");
    set_private(&login);
    let login_arg = login.display().to_string();
    plain
        .with_token(None)
        .run(&["--insecure", "login", "--token-file", &login_arg])
        .await
        .expect_code(0);
    plain
        .with_token(None)
        .run(&["get", "nodes"])
        .await
        .expect_code(0);

    // tb-nodelet without a CA: refuses to start unless --insecure.
    let ndir = dir.join("node");
    let (code, stderr) = run_nodelet_to_exit(
        &nodelet_args(&addr, "n1", &ndir),
        &[("TB_JOIN_TOKEN", "tbjoin-unused")],
    );
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains(&format!(
            "no CA configured for https://{addr}: pass --ca-cert FILE (a controller's \
             DATA_DIR/ca.pem) or set TB_CA_CERT; --insecure sends the join token"
        )),
        "{stderr}"
    );
    // And --join-token VALUE is refused outright.
    let (code, stderr) = run_nodelet_to_exit(
        &[
            nodelet_args(&addr, "n1", &ndir),
            vec!["--join-token".into(), "tbjoin-x".into()],
        ]
        .concat(),
        &[],
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--join-token-file FILE"), "{stderr}");

    assert_private(&data);
    controller.kill();
}

//! Controllers joining like k3s servers: the first controller forms the cluster and writes its
//! join token (DATA_DIR/join.token); `tb-controller --join https://FIRST --token-file FILE`
//! makes each next one a voter — three commands, three voters. The cluster then keeps every
//! acknowledged write through the loss of the first controller (the leader). A wrong token, one
//! pinning another CA, or one rotated away is refused and leaves the joiner's data dir without
//! credentials; only admins may read or rotate the token.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_api::proto::ApplyRequest;
use tb_tests::cluster::START_TIMEOUT;
use tb_tests::objects::{model, unique_namespace};
use tb_tests::{Client, Controller, ControllerConfig, Tbctl, TestDir, step, wait};

/// How long a joiner may take to become a voter (a loaded 2-core machine).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a write may take through failover.
const WRITE_BUDGET: Duration = Duration::from_secs(30);
/// The files that make a data dir a member's.
const CREDENTIALS: [&str; 3] = ["ca.pem", "ca.key", "cluster.secret"];

/// Controller `id` started with `--join https://FIRST --token-file TOKEN` and nothing else that
/// would give it credentials.
fn joiner(dir: &Path, id: u64, first: &str, token: &Path) -> ControllerConfig {
    let mut c = ControllerConfig::single(dir, id);
    c.harness_credentials = false;
    c.extra_args = vec![
        "--join".into(),
        format!("https://{first}"),
        "--token-file".into(),
        token.display().to_string(),
    ];
    c
}

/// The ids of the members every member agrees are voters, from each one's own answer.
async fn voters(client: &Client, addrs: &[String]) -> Result<Vec<u64>, String> {
    let mut agreed: Option<Vec<u64>> = None;
    for addr in addrs {
        let status = client
            .status_on(addr)
            .await
            .map_err(|e| format!("{addr}: {}", e.message()))?;
        let mut ids: Vec<u64> = status
            .members
            .iter()
            .filter(|m| m.role == "voter" && m.error.is_empty() && m.state != "unreachable")
            .map(|m| m.id)
            .collect();
        ids.sort();
        match &agreed {
            None => agreed = Some(ids),
            Some(a) if *a == ids => {}
            Some(a) => return Err(format!("{addr} sees voters {ids:?}, another {a:?}")),
        }
    }
    Ok(agreed.unwrap_or_default())
}

async fn wait_voters(client: &Client, addrs: &[String], want: &[u64]) {
    wait::expect(&format!("voters {want:?}"), JOIN_TIMEOUT, || async {
        let v = voters(client, addrs).await?;
        if v == want {
            Ok(())
        } else {
            Err(format!("voters {v:?}"))
        }
    })
    .await;
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Wait for a controller that must refuse to start to exit; its log.
async fn wait_exit(c: &mut Controller) -> String {
    let id = c.id();
    wait::expect(&format!("controller {id} to exit"), JOIN_TIMEOUT, || {
        let exited = c.exit_status();
        async move { exited.ok_or("still running") }
    })
    .await;
    let status = c.exit_status();
    assert!(
        status.is_some_and(|s| !s.success()),
        "controller {id} should fail: {status:?}\n{}",
        c.log()
    );
    c.log()
}

fn assert_no_credentials(data_dir: &Path) {
    for f in CREDENTIALS {
        assert!(
            !data_dir.join(f).exists(),
            "{} must not be written by a refused join",
            data_dir.join(f).display()
        );
    }
}

async fn apply(client: &Client, addr: &str, ns: &str, name: &str) {
    let req = ApplyRequest {
        objects_json: vec![model(ns, name, name).to_string()],
        dry_run: false,
        request_id: format!("{ns}-{name}"),
    };
    client
        .apply_on(addr, req)
        .await
        .unwrap_or_else(|e| panic!("writing {name} through {addr}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_commands_make_three_voters_that_survive_the_first() {
    let dir = TestDir::new("join");
    let mut first = Controller::start(ControllerConfig::single(dir.path(), 1));
    first.wait_serving(START_TIMEOUT).await;
    let first_addr = first.addr().to_string();
    let token_file: PathBuf = first.config().data_dir.join("join.token");
    wait::expect("the first controller's join.token", START_TIMEOUT, || {
        let exists = token_file.exists();
        async move { if exists { Ok(()) } else { Err("missing") } }
    })
    .await;
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&first.config().data_dir), 0o700);
    let token = std::fs::read_to_string(&token_file).expect("reading join.token");
    let token = token.trim().to_string();
    assert!(
        token.starts_with("tbmember1.") && token.split('.').count() == 3,
        "{token}"
    );
    let args = tb_tests::auth::controller_args();
    let at = args
        .iter()
        .position(|a| a == "--cluster-secret-file")
        .expect("the harness passes a cluster secret");
    let secret = std::fs::read_to_string(&args[at + 1]).expect("the harness's cluster secret");
    assert!(
        !token.contains(secret.trim().trim_start_matches("tbcluster-")),
        "the token must not carry the cluster secret"
    );

    // The token over the API: admins only.
    let tbctl = Tbctl::new(std::slice::from_ref(&first_addr), &dir.sub("home"));
    // (Once the admin user the first controller makes has been committed.)
    let out = wait::expect("tbctl cluster join-token", START_TIMEOUT, || async {
        let out = tbctl.run(&["cluster", "join-token"]).await;
        if out.success() {
            Ok(out)
        } else {
            Err(out.to_string())
        }
    })
    .await;
    assert_eq!(out.stdout.trim(), token);
    let made = tbctl
        .run(&[
            "admin", "user", "create", "alice", "--role", "member", "-n", "vision",
        ])
        .await;
    assert!(made.success(), "{made}");
    let alice = made.stdout.trim().to_string();
    let refused = tbctl
        .with_token(Some(&alice))
        .run(&["cluster", "join-token"])
        .await;
    assert!(
        !refused.success(),
        "a member must not read the join token: {refused}"
    );
    assert!(
        refused.stderr.contains("may not") && !refused.stdout.contains("tbmember1"),
        "{refused}"
    );

    // Two more commands.
    let mut second = Controller::start(joiner(dir.path(), 2, &first_addr, &token_file));
    second.wait_serving(START_TIMEOUT).await;
    let client = Client::new(vec![first_addr.clone(), second.addr().to_string()]);
    wait_voters(&client, client.addrs(), &[1, 2]).await;
    let third_command = Instant::now();
    let mut third = Controller::start(joiner(dir.path(), 3, &first_addr, &token_file));
    let addrs = vec![
        first_addr.clone(),
        second.addr().to_string(),
        third.addr().to_string(),
    ];
    let client = Client::new(addrs.clone());
    third.wait_serving(START_TIMEOUT).await;
    wait_voters(&client, &addrs, &[1, 2, 3]).await;
    let to_voters = third_command.elapsed();
    step!("third command to 3 voters: {} ms", to_voters.as_millis());
    println!(
        "join: third command to 3 voters in {} ms",
        to_voters.as_millis()
    );
    for c in [&second, &third] {
        let d = &c.config().data_dir;
        assert_eq!(mode(d), 0o700);
        for f in CREDENTIALS {
            assert_eq!(mode(&d.join(f)), 0o600, "{}", d.join(f).display());
        }
        // A member needs no admin token: users' tokens are in the replicated store.
        assert!(!d.join("admin.token").exists());
    }
    let status = Tbctl::new(&addrs, &dir.sub("home"))
        .run(&["cluster", "status", "-o", "json"])
        .await;
    assert!(status.success(), "{status}");
    let json: Value = status.json();
    let voter_count = json["members"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "voter").count())
        .unwrap_or(0);
    assert_eq!(voter_count, 3, "{status}");

    // Rotation: admins only; the old token stops working and every member's file follows.
    let old_token = dir.write("old.token", &format!("{token}\n"));
    let admin = Tbctl::new(&addrs, &dir.sub("home"));
    let refused = admin
        .with_token(Some(&alice))
        .run(&["cluster", "join-token", "--rotate"])
        .await;
    assert!(
        !refused.success(),
        "a member must not rotate the join token: {refused}"
    );
    let rotated = admin.run(&["cluster", "join-token", "--rotate"]).await;
    assert!(rotated.success(), "{rotated}");
    let new_token = rotated.stdout.trim().to_string();
    assert!(
        new_token.starts_with("tbmember1.") && new_token != token,
        "{rotated}"
    );
    // The CA is the same: only the secret part changes.
    assert_eq!(new_token.split('.').nth(1), token.split('.').nth(1));
    for c in [&first, &second, &third] {
        let file = c.config().data_dir.join("join.token");
        wait::expect("join.token rewritten after rotation", START_TIMEOUT, || {
            let now = std::fs::read_to_string(&file).unwrap_or_default();
            let want = new_token.clone();
            async move { if now.trim() == want { Ok(()) } else { Err(now) } }
        })
        .await;
    }
    let mut stale = Controller::start(joiner(dir.path(), 4, &first_addr, &old_token));
    let log = wait_exit(&mut stale).await;
    assert!(
        log.contains("the join token is not this cluster's"),
        "{log}"
    );
    assert_no_credentials(&stale.config().data_dir);

    // Writes through a joiner, then the first controller (the leader) dies.
    let ns = unique_namespace("join");
    apply(&client, &addrs[1], &ns, "before").await;
    let leader = client.status_on(&addrs[1]).await.expect("status").leader_id;
    step!("killing the leader, controller {leader}");
    let survivors: Vec<String> = match leader {
        1 => {
            first.kill();
            vec![addrs[1].clone(), addrs[2].clone()]
        }
        2 => {
            second.kill();
            vec![addrs[0].clone(), addrs[2].clone()]
        }
        _ => {
            third.kill();
            vec![addrs[0].clone(), addrs[1].clone()]
        }
    };
    let survivors_client = Client::new(survivors.clone());
    let after = model(&ns, "after", "after");
    survivors_client
        .apply(&[after], &format!("{ns}-after"), 0, WRITE_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("a write after the leader's loss: {e}"));
    for addr in &survivors {
        for name in ["before", "after"] {
            let got = survivors_client
                .get_on(addr, "Model", &ns, name, false)
                .await
                .unwrap_or_else(|e| panic!("reading {name} on {addr}: {e}"));
            assert!(got.contains(&format!("/models/{name}.gguf")), "{got}");
        }
    }

    // Re-running a joiner's command restarts it as the member it is.
    let (idx, joined) = if leader == 2 {
        (2, &mut third)
    } else {
        (1, &mut second)
    };
    joined.kill();
    joined.restart();
    joined.wait_serving(START_TIMEOUT).await;
    assert!(
        joined.log().contains("--join ignored"),
        "a restarted joiner must not join again"
    );
    let got = Client::new(vec![addrs[idx].clone()])
        .get_on(&addrs[idx], "Model", &ns, "after", false)
        .await;
    assert!(got.is_ok(), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_tokens_are_refused_and_write_nothing() {
    let dir = TestDir::new("join-refused");
    let mut first = Controller::start(ControllerConfig::single(dir.path(), 1));
    first.wait_serving(START_TIMEOUT).await;
    let first_addr = first.addr().to_string();
    let token_file = first.config().data_dir.join("join.token");
    wait::expect("join.token", START_TIMEOUT, || {
        let exists = token_file.exists();
        async move { if exists { Ok(()) } else { Err("missing") } }
    })
    .await;
    let token = std::fs::read_to_string(&token_file).expect("join.token");
    let parts: Vec<&str> = token.trim().split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");

    // The right CA, a wrong secret: the controller refuses it.
    let wrong_secret = dir.write(
        "wrong-secret.token",
        &format!("{}.{}.{}\n", parts[0], parts[1], "0".repeat(64)),
    );
    let mut bad = Controller::start(joiner(dir.path(), 4, &first_addr, &wrong_secret));
    let log = wait_exit(&mut bad).await;
    assert!(
        log.contains("the join token is not this cluster's"),
        "{log}"
    );
    assert_no_credentials(&bad.config().data_dir);

    // The right secret, another CA's hash: the joiner refuses the controller, sending nothing.
    // (Any other hash: no one can make a CA to match it.)
    let other_hash = "ab".repeat(32);
    let pinned_elsewhere = dir.write(
        "other-ca.token",
        &format!("{}.{other_hash}.{}\n", parts[0], parts[2]),
    );
    let mut pinned = Controller::start(joiner(dir.path(), 5, &first_addr, &pinned_elsewhere));
    let log = wait_exit(&mut pinned).await;
    assert!(
        log.contains(&format!("presents a CA whose hash is {}", parts[1]))
            && log.contains(&format!("the token pins {other_hash}")),
        "{log}"
    );
    assert_no_credentials(&pinned.config().data_dir);
    // Nothing was sent: the first controller saw no join attempt from it.
    assert!(
        !first.log().contains("id=5"),
        "the token went to a controller with another CA"
    );

    // An id in use at another address is refused.
    let good = token_file.clone();
    let mut clash = Controller::start(joiner(dir.path(), 1, &first_addr, &good));
    let log = wait_exit(&mut clash).await;
    assert!(
        log.contains("controller id 1 is already a member at"),
        "{log}"
    );
    assert_no_credentials(&clash.config().data_dir);

    // A token on the command line is refused outright.
    let mut argv = ControllerConfig::single(dir.path(), 6);
    argv.harness_credentials = false;
    argv.extra_args = vec![
        "--join".into(),
        format!("https://{first_addr}"),
        "--token".into(),
        token.trim().into(),
    ];
    let mut argv = Controller::start(argv);
    let log = wait_exit(&mut argv).await;
    assert!(log.contains("--token-file FILE"), "{log}");
}

//! TLS end to end: a controller serving with a certificate from the harness's cluster CA and a
//! nodelet that joined over TLS (and got its node certificate). Refused: tbctl trusting another
//! CA (at once, with a message naming the CA file), tbctl and a gRPC client speaking plain TCP,
//! a gRPC client trusting another CA, and a client without a CA-signed certificate calling the
//! nodelet's log service. `tbctl login --ca-cert` keeps the CA in the context.

use std::path::Path;
use std::time::{Duration, Instant};

use tb_api::proto::nodelet_client::NodeletClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{ListRequest, LogsRequest};
use tb_tests::auth::make_ca;
use tb_tests::client::{tls_endpoint, tls_endpoint_with_ca};
use tb_tests::lab::Lab;
use tonic::transport::Endpoint;

fn list_nodes() -> ListRequest {
    ListRequest {
        kind: "Node".into(),
        namespace: String::new(),
        label_selector: String::new(),
        stale: false,
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// The whole chain of an error, for matching its cause.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        parts.push(c.to_string());
        cur = c.source();
    }
    parts.join(": ")
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Call a nodelet's `Logs`; Err: why it failed (connecting, or the call).
async fn nodelet_logs(endpoint: Endpoint, req: LogsRequest) -> Result<(), String> {
    let ch = endpoint
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect: {}", chain(&e)))?;
    let mut stream = NodeletClient::new(ch)
        .logs(req)
        .await
        .map_err(|s| format!("call: {:?}: {}", s.code(), chain(&s)))?
        .into_inner();
    while let Some(_line) = stream
        .message()
        .await
        .map_err(|s| format!("stream: {:?}: {}", s.code(), chain(&s)))?
    {}
    Ok(())
}

/// The nodelet never got to answer: the connection was refused, not the request.
fn assert_refused_by_transport(result: &Result<(), String>, who: &str) {
    let Err(why) = result else {
        panic!("the nodelet served logs to {who}");
    };
    let application = [
        "InvalidArgument",
        "NotFound",
        "os error",
        "not a valid name",
    ];
    assert!(
        !application.iter().any(|a| why.contains(a)),
        "{who} reached the log service itself: {why}"
    );
}

#[tokio::test]
async fn tls_with_the_cluster_ca_only() {
    let lab = Lab::start("tls", 1).await;
    let addr = lab.addr().to_string();
    let other_dir = lab.dir().join("other-ca");
    std::fs::create_dir_all(&other_dir).expect("mkdir");
    let other_ca = other_dir.join("ca.pem");
    let (other_pem, _) = make_ca("another CA");
    write(&other_ca, &other_pem);
    let home = lab.dir().join("tls-home");
    let tbctl = tb_tests::Tbctl::new(std::slice::from_ref(&addr), &home);

    // The harness's tbctl trusts the cluster CA: it works.
    tbctl.run(&["get", "nodes"]).await.expect_code(0);

    // Another CA: refused at once, and the message names the CA file.
    let started = Instant::now();
    let out = tbctl
        .with_ca(Some(&other_ca))
        .run(&["--timeout", "10s", "get", "nodes"])
        .await;
    out.expect_code(1);
    let want = format!(
        "TLS handshake with {addr} failed: certificate not signed by the CA in {} — is --ca-cert this cluster's CA?",
        other_ca.display()
    );
    assert!(out.stderr.contains(&want), "want {want:?} in {out}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a certificate from another CA is not retried: {:?}",
        started.elapsed()
    );

    // No CA: tbctl speaks plain TCP, which a TLS controller refuses; the message says why.
    let out = tbctl
        .with_ca(None)
        .run(&["--timeout", "2s", "get", "nodes"])
        .await;
    out.expect_code(1);
    assert!(out.stderr.contains("--ca-cert"), "{out}");

    // A plain-text gRPC client is refused.
    let plain = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2));
    let refused = match plain.connect().await {
        Err(_) => true,
        Ok(ch) => tokio::time::timeout(
            Duration::from_secs(5),
            ObjectsClient::new(ch).list(list_nodes()),
        )
        .await
        .map_or(true, |r| r.is_err()),
    };
    assert!(
        refused,
        "a plain-text client got an answer from a TLS controller"
    );

    // A TLS client trusting another CA is refused during the handshake.
    let e = tls_endpoint_with_ca(&addr, &other_pem)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("a server certificate from another CA");
    let why = chain(&e);
    assert!(why.contains("UnknownIssuer"), "{why}");

    // The harness's client (the cluster CA, the admin token) is answered.
    tb_tests::Client::new(vec![addr.clone()])
        .objects(&addr)
        .list(list_nodes())
        .await
        .expect("an answer over TLS");

    // The nodelet got its certificate at join, kept privately next to its credential.
    let node = lab.nodelet(0);
    for f in ["node.pem", "node.key", "credential.json"] {
        let p = node.data_dir.join(f);
        assert!(p.exists(), "{} missing", p.display());
        #[cfg(unix)]
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    // Its log service is TLS with that certificate and serves controllers only: a client that
    // trusts the CA but presents no certificate is refused.
    let logs = LogsRequest {
        kind: "TrainingJob".into(),
        namespace: "default".into(),
        name: "nothing".into(),
        allocation: "nothing-1".into(),
        rank: 0,
        tail: -1,
        ..Default::default()
    };
    let anonymous = nodelet_logs(tls_endpoint(&node.listen), logs.clone()).await;
    assert_refused_by_transport(&anonymous, "a TLS client without a certificate");
    let plain = Endpoint::from_shared(format!("http://{}", node.listen)).expect("endpoint");
    let plain = nodelet_logs(plain, logs).await;
    assert_refused_by_transport(&plain, "a plain-text client");

    // `tbctl login --ca-cert` keeps the CA in the context: later commands need no TB_CA_CERT.
    let bare = tbctl.with_ca(None);
    let ca = tb_tests::auth::ca_cert().display().to_string();
    let out = bare.run(&["login", "--ca-cert", &ca]).await;
    out.expect_code(0);
    assert!(out.stderr.contains("CA stored"), "{out}");
    let config = std::fs::read_to_string(home.join(".config/tb/config.yaml")).expect("config");
    assert!(config.contains(&format!("ca-cert: {ca}")), "{config}");
    bare.run(&["get", "nodes"]).await.expect_code(0);
}

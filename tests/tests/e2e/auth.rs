//! Authentication and authorization end to end: a real controller and nodelet, driven through
//! gRPC and `tbctl`. Refused: no token, a wrong token, an expired token, a revoked token (all
//! UNAUTHENTICATED with the same generic message), a viewer's apply, a member's apply outside
//! its namespaces, a nodelet writing another Node's status, a member reading the audit log
//! (PERMISSION_DENIED naming the verb and kind). Allowed writes, users' changes and refusals
//! are in the audit log with who made them; `auth can-i` gives the server's answer.

use std::time::Duration;

use serde_json::Value;
use tb_api::proto::{
    ApplyRequest, AuditRequest, CanIRequest, ListRequest, UpdateStatusRequest, WatchRequest,
};
use tb_tests::lab::Lab;
use tb_tests::objects::{model, request_id};
use tb_tests::{Client, Tbctl};
use tonic::Code;

const GENERIC: &str = "invalid or missing credentials";

fn list_nodes() -> ListRequest {
    ListRequest {
        kind: "Node".into(),
        namespace: String::new(),
        label_selector: String::new(),
        stale: false,
    }
}

async fn apply_model(
    client: &Client,
    addr: &str,
    ns: &str,
    name: &str,
) -> Result<(), tonic::Status> {
    client
        .objects(addr)
        .apply(ApplyRequest {
            objects_json: vec![model(ns, name, "v1").to_string()],
            dry_run: false,
            request_id: request_id(),
        })
        .await
        .map(|_| ())
}

/// The token a `tbctl admin … create` printed: stdout, alone on its line.
fn token_of(out: &tb_tests::tbctl::TbctlOutput) -> String {
    assert!(out.success(), "expected success from {out}");
    let t = out.stdout.trim().to_string();
    assert!(t.starts_with("tbuser-") && !t.contains('\n'), "{out}");
    t
}

async fn expect_unauthenticated(client: &Client, addr: &str, what: &str) {
    let e = client
        .objects(addr)
        .list(list_nodes())
        .await
        .expect_err(what);
    assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
    assert_eq!(e.message(), GENERIC, "{what}: no detail leaks");
}

#[tokio::test]
async fn tokens_roles_namespaces_nodes_and_audit() {
    let lab = Lab::start("auth", 1).await;
    let addr = lab.addr().to_string();
    let admin = Tbctl::new(std::slice::from_ref(&addr), &lab.dir().join("home-admin"));

    // No token, a malformed one, an unknown one: the same generic refusal.
    expect_unauthenticated(
        &Client::with_token(vec![addr.clone()], None),
        &addr,
        "no token",
    )
    .await;
    expect_unauthenticated(
        &Client::with_token(vec![addr.clone()], Some("tbuser-0123456789abcdef")),
        &addr,
        "unknown token",
    )
    .await;
    expect_unauthenticated(
        &Client::with_token(vec![addr.clone()], Some("nonsense")),
        &addr,
        "malformed token",
    )
    .await;
    // Watches too, and tbctl says so.
    let e = Client::with_token(vec![addr.clone()], None)
        .objects(&addr)
        .watch(WatchRequest::default())
        .await
        .expect_err("watch without a token");
    assert_eq!(e.code(), Code::Unauthenticated);
    let out = admin.with_token(None).run(&["get", "nodes"]).await;
    assert!(!out.success() && out.stderr.contains(GENERIC), "{out}");

    // The harness's admin.
    let out = admin.run(&["whoami"]).await;
    assert!(
        out.success() && out.stdout.contains("user admin (role admin)"),
        "{out}"
    );

    // Users.
    let viewer = token_of(
        &admin
            .run(&["admin", "user", "create", "vic", "--role", "viewer"])
            .await,
    );
    let alice = token_of(
        &admin
            .run(&[
                "admin", "user", "create", "alice", "--role", "member", "-n", "vision",
            ])
            .await,
    );
    let shorty = token_of(
        &admin
            .run(&[
                "admin", "user", "create", "shorty", "--role", "viewer", "--ttl", "2s",
            ])
            .await,
    );
    let out = admin.run(&["admin", "user", "list", "-o", "json"]).await;
    let users: Value = out.json();
    let names: Vec<&str> = users
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|u| u["name"].as_str())
        .collect();
    assert_eq!(names, ["admin", "alice", "shorty", "vic"], "{out}");
    assert!(
        !out.stdout.contains("tbuser-"),
        "tokens are never listed: {out}"
    );

    // A viewer reads, and may not write.
    let vic = Client::with_token(vec![addr.clone()], Some(&viewer));
    vic.objects(&addr)
        .list(list_nodes())
        .await
        .expect("a viewer reads");
    let e = apply_model(&vic, &addr, "default", "m")
        .await
        .expect_err("viewer apply");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("apply")
            && e.message().contains("Model")
            && e.message().contains("vic"),
        "{e:?}"
    );

    // A member writes in its namespace only.
    let al = Client::with_token(vec![addr.clone()], Some(&alice));
    let e = apply_model(&al, &addr, "default", "m")
        .await
        .expect_err("member outside");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("apply")
            && e.message().contains("Model")
            && e.message().contains("\"default\""),
        "{e:?}"
    );
    apply_model(&al, &addr, "vision", "m")
        .await
        .expect("member in vision");
    let e = al
        .auth(&addr)
        .audit(AuditRequest::default())
        .await
        .expect_err("a member reads no audit log");
    assert_eq!(e.code(), Code::PermissionDenied);

    // can-i, answered by the server.
    let as_alice = admin.with_token(Some(&alice));
    let out = as_alice
        .run(&["auth", "can-i", "apply", "trainingjob", "-n", "vision"])
        .await;
    assert_eq!((out.code, out.stdout.trim()), (Some(0), "yes"), "{out}");
    let out = as_alice
        .run(&["auth", "can-i", "apply", "trainingjob", "-n", "default"])
        .await;
    assert_eq!((out.code, out.stdout.trim()), (Some(1), "no"), "{out}");
    let out = as_alice.run(&["auth", "can-i", "create", "user"]).await;
    assert_eq!(out.code, Some(1), "{out}");
    let out = admin.run(&["auth", "can-i", "delete", "node"]).await;
    assert_eq!(out.code, Some(0), "{out}");

    // Expiry.
    let short = Client::with_token(vec![addr.clone()], Some(&shorty));
    short
        .objects(&addr)
        .list(list_nodes())
        .await
        .expect("fresh token");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    expect_unauthenticated(&short, &addr, "expired token").await;

    // Revocation.
    let out = admin
        .run(&["admin", "token", "create", "--user", "alice", "--ttl", "1h"])
        .await;
    let second = token_of(&out);
    let id = out
        .stderr
        .split_whitespace()
        .skip_while(|w| *w != "id")
        .nth(1)
        .expect("token id on stderr")
        .to_string();
    let al2 = Client::with_token(vec![addr.clone()], Some(&second));
    al2.objects(&addr)
        .list(list_nodes())
        .await
        .expect("second token works");
    admin
        .run(&["admin", "token", "revoke", &id])
        .await
        .expect_code(0);
    expect_unauthenticated(&al2, &addr, "revoked token").await;
    // alice's first token still works.
    al.objects(&addr)
        .list(list_nodes())
        .await
        .expect("first token still works");

    // A nodelet's credential: its own Node, not another's.
    let nodelet = lab.nodelet(0);
    let cred: Value = serde_json::from_str(
        &std::fs::read_to_string(nodelet.data_dir.join("credential.json")).expect("credential"),
    )
    .expect("credential json");
    let cred = cred["credential"].as_str().expect("credential").to_string();
    let node = Client::with_token(vec![addr.clone()], Some(&cred));
    let who = node
        .auth(&addr)
        .who_am_i(tb_api::proto::WhoAmIRequest {})
        .await
        .expect("whoami")
        .into_inner();
    assert_eq!(
        (who.kind.as_str(), who.name.as_str()),
        ("node", nodelet.name.as_str())
    );
    let e = node
        .objects(&addr)
        .update_status(UpdateStatusRequest {
            kind: "Node".into(),
            namespace: String::new(),
            name: "someone-else".into(),
            status_json: "{}".into(),
            resource_version: 0,
            request_id: request_id(),
        })
        .await
        .expect_err("another Node's status");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("update-status") && e.message().contains("Node"),
        "{e:?}"
    );
    let e = apply_model(&node, &addr, "default", "x")
        .await
        .expect_err("a node applies nothing");
    assert_eq!(e.code(), Code::PermissionDenied);
    let can = |name: &str| CanIRequest {
        verb: "update-status".into(),
        kind: "node".into(),
        namespace: String::new(),
        name: name.into(),
    };
    let mut auth = node.auth(&addr);
    assert!(
        auth.can_i(can(&nodelet.name))
            .await
            .expect("can-i")
            .into_inner()
            .allowed
    );
    assert!(
        !auth
            .can_i(can("someone-else"))
            .await
            .expect("can-i")
            .into_inner()
            .allowed
    );
    // Controller-to-controller calls are not for users.
    let e = al
        .retrying(0, Duration::from_secs(5), |a| {
            let mut c = tb_api::proto::raft_client::RaftClient::new(al.authed(a));
            async move { c.member_status(tb_api::proto::MemberStatusRequest {}).await }
        })
        .await
        .expect_err("raft for users");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // The audit log: who did what, and what was refused (refusals are recorded best effort,
    // through Raft, so give them a moment).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = admin.run(&["audit", "-o", "json"]).await;
        let records = out.json();
        let has = |user: &str, verb: &str, kind: &str, result: &str| {
            records.as_array().expect("records").iter().any(|r| {
                r["user"] == user && r["verb"] == verb && r["kind"] == kind && r["result"] == result
            })
        };
        let all = has("alice", "apply", "Model", "ok")
            && has("alice", "apply", "Model", "PermissionDenied")
            && has("vic", "apply", "Model", "PermissionDenied")
            && has("admin", "create", "User", "ok")
            && has("admin", "delete", "Token", "ok")
            && has(
                &format!("node:{}", nodelet.name),
                "update-status",
                "Node",
                "PermissionDenied",
            );
        if all {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "audit log incomplete: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = admin
        .run(&["audit", "--user", "alice", "--since", "1h"])
        .await;
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.lines().skip(1).all(|l| l.contains("alice")),
        "{out}"
    );
    assert!(out.stdout.contains("vision"), "{out}");

    // Deleting a user ends its tokens.
    admin
        .run(&["admin", "user", "delete", "alice"])
        .await
        .expect_code(0);
    expect_unauthenticated(&al, &addr, "deleted user").await;
}

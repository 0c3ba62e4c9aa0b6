//! `tbctl cluster`: the controllers' membership and Raft progress, and changes to membership.

use anyhow::{Result, bail};
use serde::Serialize;
use tb_api::proto::{AddMemberRequest, ClusterStatusResponse, MemberStatus, RemoveMemberRequest};

use super::Ctx;
use crate::args::{ClusterCommand, ClusterOutput};
use crate::output::{Table, emit};
use crate::servers::parse_server;

pub async fn run(ctx: &mut Ctx, cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Status { output } => {
            let status = ctx.client().cluster_status().await?;
            emit(&render(&status, output)?)
        }
        ClusterCommand::AddMember { id, address } => {
            if id == 0 {
                bail!("ID: controller ids start at 1");
            }
            // Same HOST:PORT rules as --server, checked before asking the cluster.
            let address = parse_server(&address)?.to_string();
            let status = ctx
                .client()
                .add_member(AddMemberRequest {
                    id,
                    address: address.clone(),
                })
                .await?;
            let mut out = format!("member {id} added at {address}\n");
            if let Some(s) = status {
                out.push_str(&render(&s, None)?);
            }
            emit(&out)
        }
        ClusterCommand::JoinToken { rotate, out } => {
            let token = ctx.client().member_join_token(rotate).await?;
            match out {
                None => emit(&format!("{token}\n")),
                Some(path) => {
                    super::snapshot::write_private_atomically(
                        &path,
                        format!("{token}\n").as_bytes(),
                    )?;
                    emit(&format!(
                        "wrote the controller join token to {} (mode 0600)\n",
                        path.display()
                    ))
                }
            }
        }
        ClusterCommand::RemoveMember { id } => {
            let status = ctx
                .client()
                .remove_member(RemoveMemberRequest { id })
                .await?;
            let mut out = format!("member {id} removed\n");
            if let Some(s) = status {
                out.push_str(&render(&s, None)?);
            }
            emit(&out)
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson<'a> {
    /// The leader's id, or null while there is none.
    leader: Option<u64>,
    term: u64,
    members: Vec<MemberJson<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MemberJson<'a> {
    id: u64,
    address: &'a str,
    role: &'a str,
    state: &'a str,
    term: u64,
    commit_index: u64,
    applied_index: u64,
    last_log_index: u64,
    error: &'a str,
}

fn member_json(m: &MemberStatus) -> MemberJson<'_> {
    MemberJson {
        id: m.id,
        address: &m.address,
        role: &m.role,
        state: &m.state,
        term: m.term,
        commit_index: m.commit_index,
        applied_index: m.applied_index,
        last_log_index: m.last_log_index,
        error: &m.error,
    }
}

pub fn render(s: &ClusterStatusResponse, output: Option<ClusterOutput>) -> Result<String> {
    let leader = s.has_leader.then_some(s.leader_id);
    if output == Some(ClusterOutput::Json) {
        let doc = StatusJson {
            leader,
            term: s.term,
            members: s.members.iter().map(member_json).collect(),
        };
        let mut text = serde_json::to_string_pretty(&doc)?;
        text.push('\n');
        return Ok(text);
    }
    let wide = output == Some(ClusterOutput::Wide);
    let mut headers = vec![
        "ID", "ADDRESS", "ROLE", "STATE", "TERM", "COMMIT", "APPLIED", "LEADER",
    ];
    if wide {
        headers.extend(["LAST LOG", "ERROR"]);
    }
    let mut t = Table::new(headers);
    let mut members: Vec<&MemberStatus> = s.members.iter().collect();
    members.sort_by_key(|m| m.id);
    for m in members {
        let mut row = vec![
            m.id.to_string(),
            m.address.clone(),
            m.role.clone(),
            m.state.clone(),
            m.term.to_string(),
            m.commit_index.to_string(),
            m.applied_index.to_string(),
            if leader == Some(m.id) {
                "*".into()
            } else {
                String::new()
            },
        ];
        if wide {
            row.push(m.last_log_index.to_string());
            row.push(if m.error.is_empty() {
                "<none>".into()
            } else {
                m.error.clone()
            });
        }
        t.push(row);
    }
    let mut out = t.render();
    if leader.is_none() {
        out.push_str("no leader is elected\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> ClusterStatusResponse {
        let m = |id, state: &str| MemberStatus {
            id,
            address: format!("127.0.0.1:740{id}"),
            role: "voter".into(),
            state: state.into(),
            term: 3,
            commit_index: 10,
            applied_index: 10,
            last_log_index: 10,
            leader_id: 2,
            has_leader: true,
            error: String::new(),
        };
        ClusterStatusResponse {
            leader_id: 2,
            has_leader: true,
            term: 3,
            members: vec![m(2, "leader"), m(1, "follower")],
        }
    }

    #[test]
    fn json_names_the_leader() {
        let v: serde_json::Value =
            serde_json::from_str(&render(&status(), Some(ClusterOutput::Json)).expect("json"))
                .expect("parse");
        assert_eq!(v["leader"], 2);
        assert_eq!(v["members"][0]["commitIndex"], 10);
        assert_eq!(v["members"][0]["lastLogIndex"], 10);
        assert_eq!(v["members"][1]["state"], "follower");
        let mut s = status();
        s.has_leader = false;
        let v: serde_json::Value =
            serde_json::from_str(&render(&s, Some(ClusterOutput::Json)).expect("json"))
                .expect("parse");
        assert!(v["leader"].is_null());
    }

    #[test]
    fn table_marks_the_leader() {
        let text = render(&status(), None).expect("table");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID   ADDRESS"), "{text}");
        assert!(
            lines[1].starts_with("1 ") && !lines[1].ends_with('*'),
            "{text}"
        );
        assert!(
            lines[2].starts_with("2 ") && lines[2].ends_with('*'),
            "{text}"
        );
    }
}

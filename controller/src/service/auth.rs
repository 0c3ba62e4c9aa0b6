//! The `Auth` gRPC service: users and their bearer tokens, the audit log, and the server's own
//! answer to "may I?". Tokens are random, shown once, and stored as SHA-256 hashes.

use std::sync::Arc;
use tb_api::bounds::Quoted;

use tb_api::proto::auth_server::Auth;
use tb_api::proto::{
    AuditRecord as PbAuditRecord, AuditRequest, AuditResponse, CanIRequest, CanIResponse,
    CreateUserRequest, DeleteUserRequest, DeleteUserResponse, IssueTokenRequest,
    IssueTokenResponse, ListUsersRequest, ListUsersResponse, RevokeTokenRequest,
    RevokeTokenResponse, TokenInfo, UsageRequest, UsageResponse, UserInfo, WhoAmIRequest,
    WhoAmIResponse,
};
use tonic::{Request, Response, Status};

use super::{caller, check, unavailable};
use crate::auth::authorize::{AUDIT_LOG, TOKEN, USER};
use crate::auth::{
    Access, Caller, USER_TOKEN_PREFIX, Verb, authorize, hash_secret, secret, short_id,
};
use crate::raft::RaftNode;
use crate::store::{Op, Role, TokenRecord};

/// How long a user's token lives when the request does not say: 30 days.
pub const DEFAULT_USER_TOKEN_TTL: u64 = 30 * 24 * 3600;

pub struct AuthService {
    node: Arc<RaftNode>,
    /// The scheduler's settings, for the fair-share figures `Usage` reports.
    scheduler: crate::scheduler::SchedulerConfig,
}

impl AuthService {
    pub fn new(node: Arc<RaftNode>, scheduler: crate::scheduler::SchedulerConfig) -> Self {
        AuthService { node, scheduler }
    }

    async fn issue(
        &self,
        caller: &Caller,
        user: &str,
        ttl_seconds: u64,
        description: String,
    ) -> Result<IssueTokenResponse, Status> {
        let expires_at = expires_at(ttl_seconds)?;
        let token = secret(USER_TOKEN_PREFIX);
        let id = short_id();
        let op = Op::IssueToken {
            token_hash: hash_secret(&token),
            token: TokenRecord {
                id: id.clone(),
                user: user.to_string(),
                expires_at: expires_at.clone(),
                created_at: String::new(),
                description,
            },
        };
        super::commit(&self.node, String::new(), caller.user(), op).await?;
        Ok(IssueTokenResponse {
            token,
            id,
            user: user.to_string(),
            expires_at,
        })
    }
}

/// Now plus `ttl_seconds` (0: the default), in the store's timestamp format.
pub fn expires_at(ttl_seconds: u64) -> Result<String, Status> {
    let ttl = if ttl_seconds == 0 {
        DEFAULT_USER_TOKEN_TTL
    } else {
        ttl_seconds
    };
    let too_large = || Status::invalid_argument("ttlSeconds: too large");
    let ttl = i64::try_from(ttl).map_err(|_| too_large())?;
    let at = chrono::Utc::now()
        .checked_add_signed(chrono::TimeDelta::try_seconds(ttl).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    Ok(crate::scheduler::stamp(at))
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn create_user(
        &self,
        req: Request<CreateUserRequest>,
    ) -> Result<Response<IssueTokenResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        user_name("name", &req.name)?;
        check(
            &self.node,
            &caller,
            &Access::new(Verb::Create, USER, "", &req.name),
        )?;
        let role = Role::parse(&req.role).ok_or_else(|| {
            Status::invalid_argument(format!(
                "role: expected admin, member or viewer, got {}",
                Quoted(&req.role)
            ))
        })?;
        if role == Role::Member && req.namespaces.is_empty() {
            return Err(Status::invalid_argument(
                "namespaces: a member needs at least one namespace to write in (--namespace)",
            ));
        }
        let op = Op::CreateUser {
            name: req.name.clone(),
            role,
            namespaces: req.namespaces,
        };
        super::commit(&self.node, String::new(), caller.user(), op).await?;
        let reply = self
            .issue(&caller, &req.name, req.ttl_seconds, "first token".into())
            .await?;
        Ok(Response::new(reply))
    }

    async fn list_users(
        &self,
        req: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersResponse>, Status> {
        let caller = caller(&req);
        check(&self.node, &caller, &Access::new(Verb::List, USER, "", ""))?;
        self.node.linearize().await.map_err(unavailable)?;
        let state = self.node.store().read();
        let now = super::now();
        let users = state
            .users
            .values()
            .map(|u| UserInfo {
                name: u.name.clone(),
                role: u.role.as_str().into(),
                namespaces: u.namespaces.clone(),
                created_at: u.created_at.clone(),
                tokens: state
                    .user_tokens
                    .values()
                    .filter(|t| t.user == u.name && t.expires_at > now)
                    .map(|t| TokenInfo {
                        id: t.id.clone(),
                        expires_at: t.expires_at.clone(),
                        created_at: t.created_at.clone(),
                        description: t.description.clone(),
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(ListUsersResponse { users }))
    }

    async fn delete_user(
        &self,
        req: Request<DeleteUserRequest>,
    ) -> Result<Response<DeleteUserResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        user_name("name", &req.name)?;
        check(
            &self.node,
            &caller,
            &Access::new(Verb::Delete, USER, "", &req.name),
        )?;
        let op = Op::DeleteUser { name: req.name };
        super::commit(&self.node, String::new(), caller.user(), op).await?;
        Ok(Response::new(DeleteUserResponse {}))
    }

    async fn issue_token(
        &self,
        req: Request<IssueTokenRequest>,
    ) -> Result<Response<IssueTokenResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        user_name("user", &req.user)?;
        if req.description.len() > tb_api::bounds::MAX_ECHO_BYTES {
            return Err(Status::invalid_argument(format!(
                "description: {} bytes; a token's description may be at most {}",
                req.description.len(),
                tb_api::bounds::MAX_ECHO_BYTES
            )));
        }
        check(
            &self.node,
            &caller,
            &Access::new(Verb::Create, TOKEN, "", &req.user),
        )?;
        let reply = self
            .issue(&caller, &req.user, req.ttl_seconds, req.description)
            .await?;
        Ok(Response::new(reply))
    }

    async fn revoke_token(
        &self,
        req: Request<RevokeTokenRequest>,
    ) -> Result<Response<RevokeTokenResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        if req.id.is_empty() || req.id.len() > 64 {
            return Err(Status::invalid_argument(format!(
                "id: {} is not a token id (as tbctl token list shows them)",
                Quoted(&req.id)
            )));
        }
        check(
            &self.node,
            &caller,
            &Access::new(Verb::Delete, TOKEN, "", &req.id),
        )?;
        let op = Op::RevokeToken { id: req.id };
        super::commit(&self.node, String::new(), caller.user(), op).await?;
        Ok(Response::new(RevokeTokenResponse {}))
    }

    async fn who_am_i(
        &self,
        req: Request<WhoAmIRequest>,
    ) -> Result<Response<WhoAmIResponse>, Status> {
        let reply = match caller(&req) {
            Caller::User {
                name,
                role,
                namespaces,
            } => WhoAmIResponse {
                kind: "user".into(),
                name,
                role: role.as_str().into(),
                namespaces,
            },
            Caller::Node { name } => WhoAmIResponse {
                kind: "node".into(),
                name,
                ..Default::default()
            },
            Caller::Controller => WhoAmIResponse {
                kind: "controller".into(),
                ..Default::default()
            },
            Caller::Anonymous => {
                return Err(Status::unauthenticated(crate::auth::UNAUTHENTICATED));
            }
        };
        Ok(Response::new(reply))
    }

    async fn can_i(&self, req: Request<CanIRequest>) -> Result<Response<CanIResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let verb = Verb::parse(&req.verb).ok_or_else(|| {
            let verbs: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
            Status::invalid_argument(format!(
                "verb: unknown verb {}; expected one of {}",
                Quoted(&req.verb),
                verbs.join(", ")
            ))
        })?;
        let kind = canonical_kind(&req.kind)?;
        let namespace = match tb_api::Kind::parse(&kind) {
            Some(k) if !k.is_namespaced() => String::new(),
            Some(_) if req.namespace.is_empty() => "default".to_string(),
            _ => req.namespace,
        };
        let access = Access::new(verb, &kind, &namespace, &req.name);
        let reply = match authorize(&caller, &access) {
            Ok(()) => CanIResponse {
                allowed: true,
                reason: String::new(),
            },
            Err(d) => CanIResponse {
                allowed: false,
                reason: d.to_string(),
            },
        };
        Ok(Response::new(reply))
    }

    async fn audit(&self, req: Request<AuditRequest>) -> Result<Response<AuditResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        check(
            &self.node,
            &caller,
            &Access::new(Verb::List, AUDIT_LOG, "", ""),
        )?;
        let since = if req.since.is_empty() {
            String::new()
        } else {
            let t = chrono::DateTime::parse_from_rfc3339(&req.since).map_err(|e| {
                Status::invalid_argument(format!("since: not an RFC 3339 time: {e}"))
            })?;
            crate::scheduler::stamp(t.with_timezone(&chrono::Utc))
        };
        self.node.linearize().await.map_err(unavailable)?;
        let state = self.node.store().read();
        let records = state
            .audit
            .iter()
            .filter(|r| req.user.is_empty() || r.user == req.user)
            .filter(|r| r.time >= since)
            .map(|r| PbAuditRecord {
                time: r.time.clone(),
                user: r.user.clone(),
                verb: r.verb.clone(),
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                result: r.result.clone(),
            })
            .collect();
        Ok(Response::new(AuditResponse { records }))
    }

    async fn usage(&self, req: Request<UsageRequest>) -> Result<Response<UsageResponse>, Status> {
        let caller = caller(&req);
        check(
            &self.node,
            &caller,
            &Access::new(Verb::List, tb_api::Kind::Queue.as_str(), "", ""),
        )?;
        self.node.linearize().await.map_err(unavailable)?;
        let state = self.node.store().read();
        let reply = super::usage::usage_response(
            &state,
            &req.get_ref().since,
            chrono::Utc::now(),
            &self.scheduler,
        )?;
        Ok(Response::new(reply))
    }
}

/// A user's name as a request gives it: refused before anything is checked or stored when no
/// user could have it.
fn user_name(field: &str, name: &str) -> Result<(), Status> {
    tb_api::name::validate_name(name).map_err(|m| Status::invalid_argument(format!("{field}: {m}")))
}

/// A kind or alias as `tbctl auth can-i` takes it: object kinds, or User, Token, JoinToken,
/// AuditLog, ClusterMember.
fn canonical_kind(s: &str) -> Result<String, Status> {
    if let Some(k) = tb_api::Kind::parse(s) {
        return Ok(k.as_str().to_string());
    }
    use crate::auth::authorize::{CLUSTER_MEMBER, JOIN_TOKEN};
    for k in [USER, TOKEN, JOIN_TOKEN, AUDIT_LOG, CLUSTER_MEMBER] {
        let plural = format!("{k}s");
        if s.eq_ignore_ascii_case(k) || s.eq_ignore_ascii_case(&plural) {
            return Ok(k.to_string());
        }
    }
    if s.eq_ignore_ascii_case("audit") {
        return Ok(AUDIT_LOG.into());
    }
    Err(Status::invalid_argument(format!(
        "kind: unknown kind {}; expected one of {}, User, Token, JoinToken, AuditLog, ClusterMember",
        Quoted(s),
        tb_api::kind::KIND_LIST
    )))
}

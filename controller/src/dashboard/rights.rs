//! Who is looking at the dashboard, and what they see: the caller is authenticated from the
//! `Authorization: Bearer` header exactly as the gRPC API does, and only users are served
//! (a nodelet's or a controller's credential is not a sign-in).
//!
//! What each role sees: the API lets every user read every object but users, tokens and the
//! audit log; the dashboard narrows a member's view further to the namespaces they work in
//! (and cluster-scoped objects: Macs, cables, queues), since a member acts only there. Admins
//! and viewers see every namespace. Writes are decided by `auth::authorize`, as over gRPC.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Dashboard, error};
use crate::auth::{Caller, authenticate};
use crate::store::Role;

/// A signed-in user.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub caller: Caller,
}

impl Viewer {
    /// Whether this user sees objects of `namespace` (empty: cluster-scoped, seen by all).
    pub fn sees(&self, namespace: &str) -> bool {
        match &self.caller {
            Caller::User {
                role: Role::Member,
                namespaces,
                ..
            } => namespace.is_empty() || namespaces.iter().any(|n| n == namespace),
            Caller::User { .. } => true,
            _ => false,
        }
    }

    /// `{"user", "role", "namespaces"}` for the page's header.
    pub fn describe(&self) -> Value {
        match &self.caller {
            Caller::User {
                name,
                role,
                namespaces,
            } => json!({"user": name, "role": role.to_string(), "namespaces": namespaces}),
            other => json!({"user": other.audit_name()}),
        }
    }
}

/// Why a request is not served, answered as `{"error": MESSAGE}` with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

/// The user the request's token names, or the refusal: 401 without a valid user token (one
/// message whatever the cause, as the API gives).
pub fn sign_in(dashboard: &Dashboard, headers: &HeaderMap) -> Result<Viewer, Refusal> {
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let now = crate::service::now();
    let caller = {
        let state = dashboard.node.store().read();
        authenticate(&state, dashboard.node.credentials(), header, &now)
    };
    match caller {
        Ok(caller @ Caller::User { .. }) => Ok(Viewer { caller }),
        Ok(Caller::Anonymous) | Err(()) => Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "sign in with a tb user token (tbuser-...)",
        )),
        Ok(_) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "the dashboard is for users: sign in with a user token (tbuser-...)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer(role: Role, namespaces: &[&str]) -> Viewer {
        Viewer {
            caller: Caller::User {
                name: "u".into(),
                role,
                namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            },
        }
    }

    #[test]
    fn members_see_their_namespaces_and_the_cluster() {
        let m = viewer(Role::Member, &["team-a"]);
        assert!(m.sees("team-a"));
        assert!(m.sees(""), "Macs and cables are seen by everyone");
        assert!(!m.sees("team-b"));
    }

    #[test]
    fn admins_and_viewers_see_every_namespace() {
        assert!(viewer(Role::Admin, &[]).sees("team-b"));
        assert!(viewer(Role::Viewer, &[]).sees("team-b"));
    }
}

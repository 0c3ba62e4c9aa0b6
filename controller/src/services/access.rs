//! Who may send requests to an InferenceService through the stable address: a pure decision.
//!
//! Reading a service's object is open to every user (`auth::authorize`), but using it spends
//! the Macs of its namespace, so:
//! - admins: every service;
//! - members: the services of their own namespaces — a member of another namespace may not
//!   use them (403);
//! - viewers: every service (they read the cluster; an answer is a read of the model);
//! - nodes, controllers and anonymous callers: none (a nodelet's credential is not an API key).

use crate::auth::Caller;
use crate::store::Role;

/// Ok when `caller` may use the services of `namespace`; else why not.
pub fn may_use(caller: &Caller, namespace: &str) -> Result<(), String> {
    let allowed = match caller {
        Caller::User {
            role: Role::Admin | Role::Viewer,
            ..
        } => true,
        Caller::User {
            role: Role::Member,
            namespaces,
            ..
        } => namespaces.iter().any(|n| n == namespace),
        Caller::Node { .. } | Caller::Controller | Caller::Anonymous => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "{caller} may not use the InferenceServices of namespace {:?}",
            tb_api::bounds::excerpt(namespace)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(role: Role, namespaces: &[&str]) -> Caller {
        Caller::User {
            name: "u".into(),
            role,
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn members_use_only_their_namespaces() {
        assert!(may_use(&user(Role::Member, &["team-a"]), "team-a").is_ok());
        let refused = may_use(&user(Role::Member, &["team-b"]), "team-a").unwrap_err();
        assert!(refused.contains("team-a"), "{refused}");
        assert!(may_use(&user(Role::Member, &[]), "default").is_err());
    }

    #[test]
    fn admins_and_viewers_use_every_service() {
        assert!(may_use(&user(Role::Admin, &[]), "team-a").is_ok());
        assert!(may_use(&user(Role::Viewer, &[]), "team-a").is_ok());
    }

    #[test]
    fn nodes_controllers_and_anonymous_callers_use_none() {
        for c in [
            Caller::Node {
                name: "node-1".into(),
            },
            Caller::Controller,
            Caller::Anonymous,
        ] {
            assert!(may_use(&c, "default").is_err(), "{c}");
        }
    }
}

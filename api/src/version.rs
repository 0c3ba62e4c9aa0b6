//! The protocol version controllers and nodelets speak, and which versions a controller serves.
//!
//! `PROTOCOL` is raised by a release that changes what a nodelet and a controller say to each
//! other. A controller serves nodelets of its own version and the one before (N and N-1), so
//! controllers are upgraded first and nodelets after them (docs/upgrades.md). A nodelet sends
//! its version with every join and heartbeat; one from before versions were sent sends none,
//! which counts as version 1.

/// This build's protocol version.
pub const PROTOCOL: u32 = 2;

/// The version of a nodelet that sends none (released before versions were sent).
pub const UNVERSIONED: u32 = 1;

/// The oldest nodelet version a controller of this build serves.
pub const OLDEST_NODELET: u32 = PROTOCOL - 1;

/// Whether a controller of this build serves a nodelet of `version` (None: sent none); the
/// refusal says what to upgrade.
pub fn check_nodelet(version: Option<u32>) -> Result<(), String> {
    let v = version.unwrap_or(UNVERSIONED);
    if v < OLDEST_NODELET {
        Err(format!(
            "this tb-nodelet speaks protocol version {v}; this tb-controller (version {PROTOCOL}) \
             serves nodelets of versions {OLDEST_NODELET} to {PROTOCOL} — upgrade tb-nodelet"
        ))
    } else if v > PROTOCOL {
        Err(format!(
            "this tb-nodelet speaks protocol version {v}, newer than this tb-controller's \
             ({PROTOCOL}) — upgrade the controllers first, then the nodelets"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_serves_its_version_and_the_one_before() {
        assert!(check_nodelet(Some(PROTOCOL)).is_ok());
        assert!(check_nodelet(Some(PROTOCOL - 1)).is_ok());
        // A nodelet that sends no version is of the release before versions: N-1 today.
        assert!(check_nodelet(None).is_ok());
        let older = check_nodelet(Some(PROTOCOL - 2)).expect_err("N-2 is refused");
        assert!(older.contains("upgrade tb-nodelet"), "{older}");
        let newer = check_nodelet(Some(PROTOCOL + 1)).expect_err("N+1 is refused");
        assert!(newer.contains("upgrade the controllers first"), "{newer}");
    }
}

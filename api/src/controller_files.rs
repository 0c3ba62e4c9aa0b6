//! Names of the files in a controller's data dir that other programs read: `tbctl up` hands
//! the admin token and the cluster CA to the user and the nodelets, tests and benches do the same.

/// The first admin's token, written once when a controller forms a new cluster (mode 0600).
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// The cluster CA's certificate, which clients pin to verify controllers and nodelets.
pub const CA_CERT_FILE: &str = "ca.pem";

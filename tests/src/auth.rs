//! The credentials every test cluster uses: one admin token and one cluster secret per test
//! process, in files passed to each controller (`--admin-token-file`, `--cluster-secret-file`),
//! so every member of a cluster agrees and every client of the harness ([`crate::client`],
//! [`crate::tbctl`], the labs) authenticates as that admin from the start.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rand::RngCore;

struct Credentials {
    admin_token: String,
    admin_token_file: PathBuf,
    cluster_secret_file: PathBuf,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn credentials() -> &'static Credentials {
    static CREDS: OnceLock<Credentials> = OnceLock::new();
    CREDS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tb-tests-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let admin_token = format!("tbuser-{}", random_hex());
        let admin_token_file = dir.join("admin.token");
        let cluster_secret_file = dir.join("cluster.secret");
        write_private(&admin_token_file, &admin_token);
        write_private(&cluster_secret_file, &format!("tbcluster-{}", random_hex()));
        Credentials {
            admin_token,
            admin_token_file,
            cluster_secret_file,
        }
    })
}

fn write_private(path: &Path, text: &str) {
    std::fs::write(path, format!("{text}\n"))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
}

/// The token of user `admin` in every cluster the harness starts.
pub fn admin_token() -> &'static str {
    &credentials().admin_token
}

/// The flags that give a controller the harness's admin token and cluster secret.
pub fn controller_args() -> Vec<String> {
    let c = credentials();
    vec![
        "--admin-token-file".into(),
        c.admin_token_file.display().to_string(),
        "--cluster-secret-file".into(),
        c.cluster_secret_file.display().to_string(),
    ]
}

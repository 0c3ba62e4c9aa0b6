//! The credentials every test cluster uses: one admin token, one cluster secret and one cluster
//! CA per test process, in files passed to each controller (`--admin-token-file`,
//! `--cluster-secret-file`, `--tls-ca-cert`/`--tls-ca-key`), so every member of a cluster
//! agrees and every client of the harness ([`crate::client`], [`crate::tbctl`], the labs)
//! authenticates as that admin over TLS, trusting that CA ([`ca_cert`]), from the start.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rand::RngCore;

struct Credentials {
    admin_token: String,
    admin_token_file: PathBuf,
    cluster_secret_file: PathBuf,
    ca_cert_file: PathBuf,
    ca_key_file: PathBuf,
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
        let (cert, key) = make_ca("tb-tests CA");
        let ca_cert_file = dir.join("ca.pem");
        let ca_key_file = dir.join("ca.key");
        write_private(&ca_cert_file, &cert);
        write_private(&ca_key_file, &key);
        Credentials {
            admin_token,
            admin_token_file,
            cluster_secret_file,
            ca_cert_file,
            ca_key_file,
        }
    })
}

/// A new CA (ECDSA P-256) named `cn`: its certificate and key, PEM.
pub fn make_ca(cn: &str) -> (String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose,
        PKCS_ECDSA_P256_SHA256,
    };
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("a CA key");
    let mut params = CertificateParams::default();
    params.distinguished_name.remove(DnType::CommonName);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("a self-signed CA");
    (cert.pem(), key.serialize_pem())
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

/// The harness's cluster CA certificate: what its clients trust (tbctl's `TB_CA_CERT`, the
/// nodelets' `--ca-cert`, [`crate::client::Client`]).
pub fn ca_cert() -> &'static Path {
    &credentials().ca_cert_file
}

/// The CA certificate, PEM.
pub fn ca_cert_pem() -> String {
    std::fs::read_to_string(ca_cert())
        .unwrap_or_else(|e| panic!("reading {}: {e}", ca_cert().display()))
}

/// The flags that give a controller the harness's admin token, cluster secret and CA.
pub fn controller_args() -> Vec<String> {
    let c = credentials();
    vec![
        "--admin-token-file".into(),
        c.admin_token_file.display().to_string(),
        "--cluster-secret-file".into(),
        c.cluster_secret_file.display().to_string(),
        "--tls-ca-cert".into(),
        c.ca_cert_file.display().to_string(),
        "--tls-ca-key".into(),
        c.ca_key_file.display().to_string(),
    ]
}

/// The flags that make a nodelet trust the harness's CA.
pub fn nodelet_args() -> Vec<String> {
    vec!["--ca-cert".into(), ca_cert().display().to_string()]
}

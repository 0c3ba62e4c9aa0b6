//! TLS for every gRPC connection of a cluster: the cluster CA (ECDSA P-256, made with rcgen
//! when a controller forms a cluster, else loaded from `--tls-ca-cert`/`--tls-ca-key`), the
//! certificates it signs (each controller's own at start, a nodelet's at join), and the client
//! settings controllers use towards each other and towards nodelets.
//!
//! A controller's certificate serves its API and is also the client certificate it presents to
//! nodelets, whose `Nodelet` service accepts only clients with a certificate from the CA.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::OffsetDateTime;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

pub use tb_api::controller_files::CA_CERT_FILE;
/// The CA's private key in a controller's data dir.
pub const CA_KEY_FILE: &str = "ca.key";
/// How long the CA lives.
const CA_DAYS: i64 = 10 * 365;
/// How long a controller's certificate lives (a new one is made at every start).
const SERVER_DAYS: i64 = 365;
/// How long a node's certificate lives (made once, at join).
const NODE_DAYS: i64 = 5 * 365;

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The cluster CA: its certificate and the key that signs with it.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    // A little slack for clocks slightly behind.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive, as DER integers must be for serials.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

impl Ca {
    /// A new CA.
    pub fn create() -> anyhow::Result<Ca> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("making the CA key")?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "tb");
        dn.push(
            DnType::CommonName,
            format!("tb cluster CA {}", crate::auth::short_id()),
        );
        params.distinguished_name = dn;
        // Signs leaf certificates only.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial());
        validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key).context("signing the CA")?;
        let key_pem = key.serialize_pem();
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its certificate and key (PEM); refuses a key that is not the certificate's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> anyhow::Result<Ca> {
        let key = KeyPair::from_pem(key_pem).context("not a PEM private key (PKCS#8)")?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("not a PEM certificate: {e}"))?;
        let parsed = pem
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("not an X.509 certificate: {e}"))?;
        if !parsed.is_ca() {
            anyhow::bail!("the certificate is not a CA certificate");
        }
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            anyhow::bail!("the key does not belong to the certificate");
        }
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).context("reading the CA certificate")?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// Read a CA from its two files.
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Ca> {
        let cert_pem = std::fs::read_to_string(cert)
            .with_context(|| format!("reading the CA certificate {}", cert.display()))?;
        let key_pem = std::fs::read_to_string(key)
            .with_context(|| format!("reading the CA key {}", key.display()))?;
        Ca::from_pem(&cert_pem, &key_pem)
            .with_context(|| format!("CA {} + {}", cert.display(), key.display()))
    }

    /// Write the certificate and key (mode 0600) as `ca.pem` and `ca.key` in `dir`.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        crate::auth::write_private(&dir.join(CA_KEY_FILE), &self.key_pem)?;
        crate::auth::write_private(&dir.join(CA_CERT_FILE), &self.cert_pem)?;
        Ok(())
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The private key (PEM): handed only to a controller joining with the join token.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate for `names` (IP addresses or DNS names; repeats dropped) with common name
    /// `cn`, signed by the CA.
    fn issue(
        &self,
        cn: &str,
        names: &[String],
        usages: &[ExtendedKeyUsagePurpose],
        days: i64,
    ) -> anyhow::Result<CertifiedKey> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("making a key")?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "tb");
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        let mut sans: Vec<SanType> = Vec::new();
        for name in names {
            let san = match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    name.clone()
                        .try_into()
                        .with_context(|| format!("{name:?} is not a host name"))?,
                ),
            };
            if !sans.contains(&san) {
                sans.push(san);
            }
        }
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        validity(&mut params, days);
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing a certificate for {cn}"))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A controller's certificate: for the host it advertises, `extra` names, 127.0.0.1, ::1
    /// and localhost; good for serving and for calling nodelets.
    pub fn issue_controller(
        &self,
        id: u64,
        advertise: &str,
        extra: &[String],
    ) -> anyhow::Result<CertifiedKey> {
        self.issue(
            &format!("tb-controller {id}"),
            &names(advertise, extra),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            SERVER_DAYS,
        )
    }

    /// A node's certificate, for the host of the address it registered (plus 127.0.0.1, ::1
    /// and localhost); good for serving only.
    pub fn issue_node(&self, node: &str, address: &str) -> anyhow::Result<CertifiedKey> {
        self.issue(
            &format!("tb-nodelet {node}"),
            &names(address, &[]),
            &[ExtendedKeyUsagePurpose::ServerAuth],
            NODE_DAYS,
        )
    }
}

impl Ca {
    /// The certificate rank 0 of InferenceService `namespace/name` serves its endpoint with:
    /// for [`tb_api::https::service_server_name`] alone (no address), so that it cannot pass
    /// for a node, a controller or another service; good for serving only.
    pub fn issue_service(&self, namespace: &str, name: &str) -> anyhow::Result<CertifiedKey> {
        self.issue(
            &format!("tb InferenceService {namespace}/{name}"),
            &[tb_api::https::service_server_name(namespace, name)],
            &[ExtendedKeyUsagePurpose::ServerAuth],
            NODE_DAYS,
        )
    }
}

/// The host of `HOST:PORT` (brackets of an IPv6 host removed); the whole string without a port.
pub fn host_of(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => addr,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

fn names(address: &str, extra: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let host = host_of(address);
    if !host.is_empty() {
        out.push(host.to_string());
    }
    out.extend(extra.iter().cloned());
    out.extend(["127.0.0.1".into(), "::1".into(), "localhost".into()]);
    out
}

/// Where a controller's CA comes from.
#[derive(Debug, Clone, Default)]
pub struct CaSource {
    /// `--tls-ca-cert` and `--tls-ca-key`.
    pub files: Option<(PathBuf, PathBuf)>,
}

/// The CA a controller uses: the given files; else `ca.pem` + `ca.key` in the data dir; else,
/// when `may_create` (this controller forms a cluster alone), a new one written there.
pub fn load_or_create_ca(
    source: &CaSource,
    data_dir: &Path,
    may_create: bool,
) -> anyhow::Result<Ca> {
    if let Some((cert, key)) = &source.files {
        return Ca::load(cert, key);
    }
    let cert = data_dir.join(CA_CERT_FILE);
    let key = data_dir.join(CA_KEY_FILE);
    if cert.exists() || key.exists() {
        return Ca::load(&cert, &key);
    }
    if !may_create {
        anyhow::bail!(
            "no cluster CA: every controller of a cluster of several (or one joining with --join) \
             needs the cluster's CA; pass --tls-ca-cert and --tls-ca-key (make them once with \
             `tb-controller init-ca DIR`, or take the first controller's {}/{CA_CERT_FILE} and \
             {CA_KEY_FILE}), or --insecure for plain TCP",
            data_dir.display()
        );
    }
    let ca = Ca::create()?;
    ca.save(data_dir)?;
    tracing::info!(
        cert = %cert.display(),
        "created the cluster CA; clients trust it with --ca-cert (tbctl, tb-nodelet)"
    );
    Ok(ca)
}

/// This controller's TLS: the CA and its own certificate.
#[derive(Debug)]
pub struct ControllerTls {
    pub ca: Ca,
    pub cert: CertifiedKey,
}

impl ControllerTls {
    /// What the gRPC server presents.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert.cert_pem, &self.cert.key_pem))
    }

    /// What calls to other controllers and to nodelets use: the CA, and this controller's
    /// certificate for nodelets that ask for one.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.cert_pem))
            .identity(Identity::from_pem(&self.cert.cert_pem, &self.cert.key_pem))
    }
}

#[cfg(test)]
mod tests;

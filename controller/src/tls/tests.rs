//! The CA and the certificates it issues: names, validity, usages, signatures.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::*;

fn der(pem: &str) -> Vec<u8> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
    p.contents
}

fn sans(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    let ext = cert
        .subject_alternative_name()
        .expect("one SAN extension")
        .expect("a SAN extension");
    for name in &ext.value.general_names {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(b) => ips.push(match b.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(*b).expect("v4")),
                _ => IpAddr::from(<[u8; 16]>::try_from(*b).expect("v6")),
            }),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    (dns, ips)
}

fn days_left(cert: &X509Certificate<'_>) -> i64 {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    (cert.validity().not_after.timestamp() - now) / 86_400
}

#[test]
fn a_new_ca_is_a_ca_and_loads_back() {
    let ca = Ca::create().expect("CA");
    let der = der(ca.cert_pem());
    let (_, cert) = X509Certificate::from_der(&der).expect("X.509");
    assert!(cert.is_ca());
    assert!(cert.validity().is_valid());
    assert!((CA_DAYS - 1..=CA_DAYS).contains(&days_left(&cert)));
    // Self-signed.
    cert.verify_signature(None).expect("self-signed");
    let again = Ca::from_pem(&ca.cert_pem, &ca.key_pem).expect("loads");
    assert_eq!(again.cert_pem(), ca.cert_pem());
}

#[test]
fn a_key_from_another_ca_is_refused() {
    let a = Ca::create().expect("CA");
    let b = Ca::create().expect("CA");
    let e = format!(
        "{:#}",
        Ca::from_pem(&a.cert_pem, &b.key_pem).expect_err("mismatch")
    );
    assert!(e.contains("does not belong"), "{e}");
    let e = format!(
        "{:#}",
        Ca::from_pem("nope", &a.key_pem).expect_err("garbage")
    );
    assert!(e.contains("PEM"), "{e}");
}

#[test]
fn a_controller_certificate_names_its_hosts_and_is_signed_by_the_ca() {
    let ca = Ca::create().expect("CA");
    let other = Ca::create().expect("another CA");
    let ck = ca
        .issue_controller(2, "10.1.2.3:7400", &["mac2.local".into()])
        .expect("issue");
    let der_ = der(&ck.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der_).expect("X.509");
    let (dns, ips) = sans(&cert);
    assert_eq!(dns, ["mac2.local", "localhost"]);
    assert_eq!(
        ips,
        [
            IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        ]
    );
    assert!(!cert.is_ca());
    assert!(cert.validity().is_valid());
    assert!((SERVER_DAYS - 1..=SERVER_DAYS).contains(&days_left(&cert)));
    let eku = cert
        .extended_key_usage()
        .expect("one EKU")
        .expect("an EKU")
        .value;
    assert!(eku.server_auth && eku.client_auth);

    let ca_der = der(ca.cert_pem());
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).expect("CA X.509");
    assert_eq!(cert.issuer(), ca_cert.subject());
    cert.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the CA");
    let other_der = der(other.cert_pem());
    let (_, other_cert) = X509Certificate::from_der(&other_der).expect("X.509");
    assert!(
        cert.verify_signature(Some(other_cert.public_key()))
            .is_err()
    );
    // The key is the certificate's.
    let key = KeyPair::from_pem(&ck.key_pem).expect("key");
    assert_eq!(
        cert.public_key().subject_public_key.data.as_ref(),
        key.public_key_raw()
    );
}

#[test]
fn a_node_certificate_serves_only() {
    let ca = Ca::create().expect("CA");
    let ck = ca.issue_node("node-1", "mac1.lab:7600").expect("issue");
    let der_ = der(&ck.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der_).expect("X.509");
    let (dns, _) = sans(&cert);
    assert_eq!(dns, ["mac1.lab", "localhost"]);
    let eku = cert.extended_key_usage().expect("EKU").expect("EKU").value;
    assert!(eku.server_auth && !eku.client_auth);
    assert!((NODE_DAYS - 1..=NODE_DAYS).contains(&days_left(&cert)));
    assert!(cert.subject().to_string().contains("tb-nodelet node-1"));
}

#[test]
fn a_loaded_ca_signs_like_the_original() {
    let ca = Ca::create().expect("CA");
    let loaded = Ca::from_pem(&ca.cert_pem, &ca.key_pem).expect("loads");
    let ck = loaded.issue_node("n", "127.0.0.1:1").expect("issue");
    let der_ = der(&ck.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der_).expect("X.509");
    let ca_der = der(ca.cert_pem());
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).expect("CA X.509");
    cert.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the CA");
}

#[test]
fn hosts_of_addresses() {
    assert_eq!(host_of("10.0.0.1:7400"), "10.0.0.1");
    assert_eq!(host_of("[::1]:7400"), "::1");
    assert_eq!(host_of("mac1"), "mac1");
    assert_eq!(host_of("mac1.local:7400"), "mac1.local");
}

#[test]
fn ca_files_in_the_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = CaSource::default();
    let e = format!(
        "{:#}",
        load_or_create_ca(&src, dir.path(), false).expect_err("no CA to join with")
    );
    assert!(e.contains("--tls-ca-cert"), "{e}");
    let made = load_or_create_ca(&src, dir.path(), true).expect("created");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(CA_KEY_FILE))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let again = load_or_create_ca(&src, dir.path(), false).expect("loaded");
    assert_eq!(again.cert_pem(), made.cert_pem());
    let given = CaSource {
        files: Some((dir.path().join(CA_CERT_FILE), dir.path().join(CA_KEY_FILE))),
    };
    let other = tempfile::tempdir().expect("tempdir");
    let from_flags = load_or_create_ca(&given, other.path(), false).expect("from flags");
    assert_eq!(from_flags.cert_pem(), made.cert_pem());
}

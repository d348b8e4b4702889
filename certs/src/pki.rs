//! Keys and certificates of the cert controller (rcgen, ring): self-signed signers, the serving
//! and client certificates they sign, and what a PEM certificate says (x509-parser): subject,
//! issuer, validity and DNS names, which the rotation decisions read.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;
use x509_parser::extensions::ParsedExtension;

use kubekit::error::{Error, Result};

/// How far back a new certificate's `notBefore` is set, for clocks a little behind ours.
pub const BACKDATE: Duration = Duration::from_secs(60);

/// A certificate and its private key, PEM (`tls.crt`, `tls.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

/// What the rotation decisions need from a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The DER of the whole certificate (to tell certificates apart in a bundle).
    pub der: Vec<u8>,
    /// Raw DER of the subject and issuer names (a leaf's issuer is its signer's subject).
    pub subject: Vec<u8>,
    pub issuer: Vec<u8>,
    /// Validity, Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// Subject and authority key identifiers (a renewed signer keeps its name, not its key).
    pub key_id: Option<Vec<u8>>,
    pub authority_key_id: Option<Vec<u8>>,
}

impl CertInfo {
    /// Whether `signer` issued this certificate (by name and key identifier).
    pub fn issued_by(&self, signer: &CertInfo) -> bool {
        self.issuer == signer.subject
            && self.authority_key_id.is_some()
            && self.authority_key_id == signer.key_id
    }
}

/// Every certificate of a PEM text that parses (others are skipped: a bundle with a damaged
/// entry still yields the good ones).
pub fn parse_certs(pem: &str) -> Vec<CertInfo> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(|c| c.ok())
        .filter_map(|der| info(&der))
        .collect()
}

/// The first certificate of a PEM text, if it parses.
pub fn parse_cert(pem: &str) -> Option<CertInfo> {
    parse_certs(pem).into_iter().next()
}

fn info(der: &[u8]) -> Option<CertInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let (mut key_id, mut authority_key_id) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => key_id = Some(id.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                authority_key_id = aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => {}
        }
    }
    Some(CertInfo {
        key_id,
        authority_key_id,
        der: der.to_vec(),
        subject: cert.subject().as_raw().to_vec(),
        issuer: cert.issuer().as_raw().to_vec(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        dns_names,
    })
}

/// The PEM of one certificate's DER.
pub fn pem_of(der: &[u8]) -> String {
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Whether a PEM private key parses (a signer or leaf with a damaged key is made anew).
pub fn key_parses(pem: &str) -> bool {
    KeyPair::from_pem(pem).is_ok()
}

/// The DNS names a Service answers to in the cluster.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// What a signed certificate is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// TLS server for these DNS names (the first is also the common name).
    Server(Vec<String>),
    /// TLS client with this common name.
    Client(String),
}

fn bad(what: &str, e: rcgen::Error) -> Error {
    Error::Certificate(format!("{what}: {e}"))
}

fn time_at(unix: i64) -> Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|e| Error::Certificate(format!("time {unix}: {e}")))
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// A new self-signed signer (CA) named `common_name`, valid from `now` for `lifetime`.
pub fn make_signer(common_name: &str, now: i64, lifetime: Duration) -> Result<Pair> {
    let key = KeyPair::generate().map_err(|e| bad("generating a signer key", e))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = time_at(now.saturating_sub(secs(BACKDATE)))?;
    params.not_after = time_at(now.saturating_add(secs(lifetime)))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| bad(&format!("self-signing {common_name}"), e))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A new certificate for `usage` signed by `signer`, valid from `now` until `not_after`.
pub fn make_signed(signer: &Pair, usage: &Usage, now: i64, not_after: i64) -> Result<Pair> {
    let signer_key = KeyPair::from_pem(&signer.key).map_err(|e| bad("the signer's key", e))?;
    let issuer = Issuer::from_ca_cert_pem(&signer.cert, signer_key)
        .map_err(|e| bad("the signer's certificate", e))?;
    let key = KeyPair::generate().map_err(|e| bad("generating a key", e))?;
    let (mut params, common_name, purpose) = match usage {
        Usage::Server(names) => (
            CertificateParams::new(names.clone()).map_err(|e| bad("DNS names", e))?,
            names.first().cloned().unwrap_or_default(),
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        Usage::Client(name) => (
            CertificateParams::default(),
            name.clone(),
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    };
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name.as_str());
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![purpose];
    params.use_authority_key_identifier_extension = true;
    params.not_before = time_at(now.saturating_sub(secs(BACKDATE)))?;
    params.not_after = time_at(not_after)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| bad(&format!("signing {common_name}"), e))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_server_certificate_names_its_signer_and_the_service() {
        let now = 1_800_000_000;
        let ca = make_signer("test-signer@1", now, Duration::from_secs(3600)).unwrap();
        let names = service_dns_names("svc", "ns");
        let leaf = make_signed(&ca, &Usage::Server(names.clone()), now, now + 600).unwrap();
        let ca_info = parse_cert(&ca.cert).unwrap();
        let leaf_info = parse_cert(&leaf.cert).unwrap();
        assert!(leaf_info.issued_by(&ca_info));
        assert_eq!(leaf_info.dns_names, names);
        assert_eq!(leaf_info.not_after, now + 600);
        assert_eq!(leaf_info.not_before, now - 60);
        assert_eq!(ca_info.not_after, now + 3600);
        assert!(key_parses(&leaf.key));
        assert_eq!(parse_certs(&pem_of(&leaf_info.der)), vec![leaf_info]);
    }
}

//! A throw-away test CA and a server certificate for `127.0.0.1` / `localhost`, made with the
//! `openssl` CLI into a temporary directory that lives as long as the [`TestCa`].
//!
//! Keys are ECDSA P-256 (fast to generate, accepted by rustls/webpki and nginx). The server
//! certificate carries `subjectAltName = IP:127.0.0.1, DNS:localhost` and `extendedKeyUsage =
//! serverAuth`; both certificates are valid for two days.
//!
//! Tests must pass [`TestCa::ca_pem`] to the client explicitly: the machines export
//! `SSL_CERT_FILE` and friends, which must not be relied on (nor polluted).

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A test CA plus one server certificate signed by it.
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Makes a fresh CA and server certificate. Panics with a clear message when `openssl` is
    /// missing or fails.
    pub fn new() -> TestCa {
        TestCa::for_ip(None)
    }

    /// [`TestCa::new`] whose server certificate also names `ip` (a test cluster's node address).
    pub fn for_ip(ip: Option<&str>) -> TestCa {
        let extra = ip.map(|ip| format!(", IP:{ip}")).unwrap_or_default();
        let dir = tempfile::Builder::new()
            .prefix("testkit-ca-")
            .tempdir()
            .expect("creating a temp dir for the test CA");
        let d = dir.path();
        make_ca(d, "ca", "Quarry testkit CA");
        signed_cert(
            d,
            "/CN=localhost",
            ("key.pem", "cert.pem"),
            &format!(
                "subjectAltName = IP:127.0.0.1, DNS:localhost{extra}\n\
                 basicConstraints = critical, CA:FALSE\n\
                 keyUsage = critical, digitalSignature, keyEncipherment\n\
                 extendedKeyUsage = serverAuth\n\
                 subjectKeyIdentifier = hash\n\
                 authorityKeyIdentifier = keyid\n"
            ),
        );
        TestCa { dir }
    }

    /// The CA certificate (PEM): what a client must trust.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM) for `127.0.0.1` and `localhost`, signed by the CA.
    pub fn cert_pem(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// The server certificate's private key (PEM, unencrypted).
    pub fn key_pem(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// A client certificate (`extendedKeyUsage = clientAuth`, CN `name`) signed by the CA, for
    /// mutual TLS: returns the certificate and key PEM paths.
    pub fn client_cert(&self, name: &str) -> (PathBuf, PathBuf) {
        let d = self.dir.path();
        let (cert, key) = (format!("client-{name}.pem"), format!("client-{name}.key"));
        signed_cert(
            d,
            &format!("/CN={name}"),
            (&key, &cert),
            "basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature\n\
             extendedKeyUsage = clientAuth\n",
        );
        (d.join(cert), d.join(key))
    }

    /// The directory holding all of the above.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

/// A self-signed P-256 CA in `dir`: `NAME.pem` and `NAME.key`, with common name `cn`.
pub(crate) fn make_ca(dir: &Path, name: &str, cn: &str) {
    let (key, pem, subj) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={cn}"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subj,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A P-256 key and a certificate for `subject` with `extensions`, signed by the CA in `dir`.
fn signed_cert(dir: &Path, subject: &str, key_cert: (&str, &str), extensions: &str) {
    signed_by(dir, "ca", subject, key_cert, extensions)
}

/// A P-256 key and a certificate for `subject` with `extensions`, signed by CA `ca` (`ca.pem`,
/// `ca.key`) in `dir`.
pub(crate) fn signed_by(
    dir: &Path,
    ca: &str,
    subject: &str,
    (key, cert): (&str, &str),
    extensions: &str,
) {
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    std::fs::write(dir.join("cert.ext"), extensions).expect("writing cert.ext");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            "cert.csr",
            "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "cert.csr",
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            "cert.ext",
        ],
    );
}

/// A 2048-bit RSA key pair made by openssl in `dir`: `NAME.key` (PKCS#8) and `NAME.pub` (SPKI),
/// for upload-token signing tests (keys that did not come from quarry).
pub fn rsa_key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (private, public) = (format!("{name}.key"), format!("{name}.pub"));
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &private,
        ],
    );
    openssl(dir, &["pkey", "-in", &private, "-pubout", "-out", &public]);
    (dir.join(private), dir.join(public))
}

pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("testkit: cannot run `openssl` ({e}); install it (Debian package `openssl`)")
        });
    assert!(
        out.status.success(),
        "testkit: `openssl {}` failed: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_ca_and_a_server_cert_that_verifies_against_it() {
        let ca = TestCa::new();
        for p in [ca.ca_pem(), ca.cert_pem(), ca.key_pem()] {
            assert!(p.is_file(), "{} missing", p.display());
        }
        let out = Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(ca.ca_pem())
            .arg("-verify_ip")
            .arg("127.0.0.1")
            .arg(ca.cert_pem())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

//! Upload tokens as CDI issues them: compact JWTs signed PS256 (RSASSA-PSS, SHA-256) whose
//! payload carries CDI's claims, and the RSA key pairs that sign and verify them.
//!
//! ```json
//! {"iss":"cdi-apiserver","iat":1700000000,"nbf":1700000000,"exp":1700000300,
//!  "operation":"Upload","name":"disk","namespace":"vms",
//!  "resource":{"group":"","version":"v1","resource":"persistentvolumeclaims"}}
//! ```
//!
//! Verification follows CDI's proxy: the signature must verify, the issuer must be
//! `cdi-apiserver`, `nbf`/`exp`/`iat` are checked with 10 seconds of leeway, and the token must be
//! an `Upload` token for a named PVC.
//!
//! The same key signs CDI's clone tokens (operation `Clone`, the source as name/namespace/resource
//! and the target in `params`), which the DataVolume webhook puts on a cloning DataVolume;
//! [`verify_signed`] checks only the signature and leaves their claims to the caller.
//!
//! [`sign_jwt`] signs other claims too, PS256 or RS256: the importer's Google service-account
//! assertions (RS256 with `typ` and `kid`) use it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rsa::Generate as _;
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
/// The key types of signing and verifying.
pub use rsa::{PrivateKey, PublicKey};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

mod error;

use error::read_file;
pub use error::{Error, ErrorKind, Result};

/// CDI's issuer of upload tokens.
pub const ISSUER: &str = "cdi-apiserver";
/// CDI's token lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);
/// Clock skew tolerated when checking `nbf`, `exp` and `iat` (CDI's proxy uses 10 s).
pub const LEEWAY_SECONDS: i64 = 10;
/// The only operation an upload token may carry.
pub const OPERATION_UPLOAD: &str = "Upload";
/// The operation of a clone token.
pub const OPERATION_CLONE: &str = "Clone";
/// The resource an upload token names.
pub const RESOURCE_PVC: &str = "persistentvolumeclaims";

/// A Kubernetes GroupVersionResource, as CDI serialises it (every field present).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Resource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// The registered claims plus CDI's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(default)]
    pub iss: String,
    #[serde(default)]
    pub iat: i64,
    #[serde(default)]
    pub nbf: i64,
    #[serde(default)]
    pub exp: i64,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub resource: Resource,
    /// Extra parameters (a clone token's `targetNamespace` and `targetName`); CDI omits them
    /// when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

impl Claims {
    /// An upload token's claims for PVC `namespace/name`, issued at `now` (Unix seconds).
    pub fn upload(namespace: &str, name: &str, now: i64, ttl: Duration) -> Claims {
        let resource = Resource {
            group: String::new(),
            version: "v1".into(),
            resource: RESOURCE_PVC.into(),
        };
        Claims::issued(OPERATION_UPLOAD, (namespace, name), resource, now, ttl)
    }

    /// Claims of `operation` on `resource` `namespace/name`, issued by [`ISSUER`] at `now`.
    pub fn issued(
        operation: &str,
        (namespace, name): (&str, &str),
        resource: Resource,
        now: i64,
        ttl: Duration,
    ) -> Claims {
        Claims {
            iss: ISSUER.into(),
            iat: now,
            nbf: now,
            exp: now.saturating_add(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
            operation: operation.into(),
            name: name.into(),
            namespace: namespace.into(),
            resource,
            params: BTreeMap::new(),
        }
    }

    /// Checks times (with leeway) and the upload claims.
    pub fn check(&self, now: i64) -> Result<()> {
        let bad = |why: String| Err(Error::Unauthorized(why));
        if self.iss != ISSUER {
            return bad(format!("issuer {:?} is not {ISSUER:?}", self.iss));
        }
        if now > self.exp.saturating_add(LEEWAY_SECONDS) {
            return bad(format!("expired {} s ago", now - self.exp));
        }
        if now < self.nbf.saturating_sub(LEEWAY_SECONDS) {
            return bad("not valid yet (nbf is in the future)".into());
        }
        if now < self.iat.saturating_sub(LEEWAY_SECONDS) {
            return bad("issued in the future".into());
        }
        if self.operation != OPERATION_UPLOAD {
            return bad(format!("operation {:?} is not Upload", self.operation));
        }
        if self.resource.resource != RESOURCE_PVC {
            return bad(format!(
                "resource {:?} is not {RESOURCE_PVC}",
                self.resource.resource
            ));
        }
        if self.name.is_empty() || self.namespace.is_empty() {
            return bad("no PVC name or namespace".into());
        }
        Ok(())
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
}

/// The RSA signature algorithms JWTs are signed with here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Algorithm {
    /// RSASSA-PSS with SHA-256: CDI's upload and clone tokens.
    #[serde(rename = "PS256")]
    Ps256,
    /// RSASSA-PKCS1-v1_5 with SHA-256: what Google's token endpoint takes from service accounts.
    #[serde(rename = "RS256")]
    Rs256,
}

/// A JWT's header: the algorithm, and the `typ` and `kid` when a verifier wants them.
#[derive(Debug, Clone, Serialize)]
pub struct JwtHeader<'a> {
    pub alg: Algorithm,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typ: Option<&'a str>,
    /// The id of the signing key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kid: Option<&'a str>,
}

/// Signs `claims` into a compact CDI token (PS256, a header of `alg` only, as CDI's).
pub fn sign(claims: &Claims, key: &PrivateKey) -> Result<String> {
    let header = JwtHeader {
        alg: Algorithm::Ps256,
        typ: None,
        kid: None,
    };
    sign_jwt(&header, claims, key)
}

/// Signs any claims (a JSON object) into a compact JWT with `header`'s algorithm.
pub fn sign_jwt(
    header: &JwtHeader<'_>,
    claims: &impl Serialize,
    key: &PrivateKey,
) -> Result<String> {
    let signing_input = format!("{}.{}", base64_json(header)?, base64_json(claims)?);
    let input = signing_input.as_bytes();
    let failed = |e: rsa::signature::Error| Error::InvalidInput(format!("signing the token: {e}"));
    let signature = match header.alg {
        Algorithm::Ps256 => rsa::pss::SigningKey::<Sha256>::new(key.clone())
            .try_sign(input)
            .map_err(failed)?
            .to_bytes(),
        Algorithm::Rs256 => rsa::pkcs1v15::SigningKey::<Sha256>::new(key.clone())
            .try_sign(input)
            .map_err(failed)?
            .to_bytes(),
    };
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// A JWT part: JSON, base64url without padding.
fn base64_json(v: &impl Serialize) -> Result<String> {
    serde_json::to_vec(v)
        .map(|json| URL_SAFE_NO_PAD.encode(json))
        .map_err(|e| Error::InvalidInput(format!("the token's claims are not JSON: {e}")))
}

/// Verifies a compact JWT's PS256 signature and upload claims at time `now`. A string that is
/// not a JWT at all is [`Error::MalformedToken`]; a JWT that fails any check is
/// [`Error::Unauthorized`].
pub fn verify(token: &str, key: &PublicKey, now: i64) -> Result<Claims> {
    let claims = verify_signed(token, key)?;
    claims.check(now)?;
    Ok(claims)
}

/// Verifies a compact JWT's PS256 signature and returns its claims, unchecked (errors as
/// [`verify`]'s).
pub fn verify_signed(token: &str, key: &PublicKey) -> Result<Claims> {
    let malformed = |why: &str| Error::MalformedToken(why.to_string());
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("not three dot-separated parts"));
    };
    let decode = |part: &str, what: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| malformed(&format!("{what} is not base64url")))
    };
    let header: Header = serde_json::from_slice(&decode(h, "header")?)
        .map_err(|_| malformed("header is not a JSON object with alg"))?;
    let payload = decode(p, "payload")?;
    let signature = decode(s, "signature")?;
    if header.alg != "PS256" {
        return Err(Error::Unauthorized(format!(
            "algorithm {:?} is not PS256",
            header.alg
        )));
    }
    let signature = rsa::pss::Signature::try_from(signature.as_slice())
        .map_err(|_| Error::Unauthorized("bad signature".into()))?;
    rsa::pss::VerifyingKey::<Sha256>::new_with_auto_salt_len(key.clone())
        .verify(&token.as_bytes()[..h.len() + 1 + p.len()], &signature)
        .map_err(|_| Error::Unauthorized("signature does not verify".into()))?;
    serde_json::from_slice(&payload)
        .map_err(|e| Error::Unauthorized(format!("claims are not CDI's: {e}")))
}

/// A fresh RSA key pair (3072 bits, from the OS random source) as PEM: PKCS#8 private key, SPKI public key.
pub fn generate() -> Result<(String, String)> {
    let key = PrivateKey::try_generate()
        .map_err(|e| Error::InvalidInput(format!("generating an RSA key: {e}")))?;
    private_and_public_pem(&key)
}

fn private_and_public_pem(key: &PrivateKey) -> Result<(String, String)> {
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| Error::InvalidInput(format!("encoding the private key: {e}")))?;
    let public = key
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| Error::InvalidInput(format!("encoding the public key: {e}")))?;
    Ok((private.to_string(), public))
}

/// Reads a PEM private key (PKCS#8 `PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`).
pub fn load_private_key(path: &Path) -> Result<PrivateKey> {
    let pem = String::from_utf8(read_file(path, "private key")?)
        .map_err(|_| Error::InvalidInput(format!("{} is not PEM text", path.display())))?;
    private_key_from_pem(&pem, &path.display().to_string())
}

/// Parses a PEM private key (PKCS#8 or PKCS#1); `what` names where it came from.
pub fn private_key_from_pem(pem: &str, what: &str) -> Result<PrivateKey> {
    PrivateKey::from_pkcs8_pem(pem)
        .or_else(|_| PrivateKey::from_pkcs1_pem(pem))
        .map_err(|e| Error::InvalidInput(format!("{what} holds no RSA private key in PEM: {e}")))
}

/// The SPKI public key (PEM) of a private key.
pub fn public_key_pem(key: &PrivateKey) -> Result<String> {
    private_and_public_pem(key).map(|(_, public)| public)
}

/// Reads a PEM public key (SPKI `PUBLIC KEY` or PKCS#1 `RSA PUBLIC KEY`).
pub fn load_public_key(path: &Path) -> Result<PublicKey> {
    let pem = String::from_utf8(read_file(path, "public key")?)
        .map_err(|_| Error::InvalidInput(format!("{} is not PEM text", path.display())))?;
    PublicKey::from_public_key_pem(&pem)
        .or_else(|_| PublicKey::from_pkcs1_pem(&pem))
        .map_err(|e| {
            Error::InvalidInput(format!(
                "{} holds no RSA public key in PEM: {e}",
                path.display()
            ))
        })
}

/// The token inside an `Authorization` header value, as CDI's proxy matches it
/// (`Bearer` + spaces + base64url/JWT characters).
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case("bearer") || !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let token = rest.trim_start();
    let ok = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    ok.then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    /// Key generation is slow-ish: one pair for the whole module.
    fn keys() -> &'static (PrivateKey, PrivateKey) {
        static KEYS: OnceLock<(PrivateKey, PrivateKey)> = OnceLock::new();
        KEYS.get_or_init(|| {
            (
                PrivateKey::try_generate().unwrap(),
                PrivateKey::try_generate().unwrap(),
            )
        })
    }

    const NOW: i64 = 1_800_000_000;

    fn token(claims: &Claims) -> String {
        sign(claims, &keys().0).unwrap()
    }

    fn public() -> PublicKey {
        keys().0.to_public_key()
    }

    #[test]
    fn a_fresh_token_verifies_with_cdis_claims() {
        let claims = Claims::upload("vms", "disk", NOW, DEFAULT_TTL);
        let t = token(&claims);
        assert_eq!(verify(&t, &public(), NOW + 1).unwrap(), claims);
        let payload: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(t.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(payload["exp"], NOW + 300);
        assert_eq!(payload["iss"], "cdi-apiserver");
        assert_eq!(payload["operation"], "Upload");
        assert_eq!(payload["resource"]["resource"], "persistentvolumeclaims");
        assert_eq!(payload["resource"]["group"], "");
        let header: serde_json::Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(t.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], "PS256");
    }

    /// RS256 is PKCS#1 v1.5 (deterministic: the same input, the same signature) and the header
    /// carries `typ` and `kid` when given.
    #[test]
    fn rs256_jwts_verify_with_pkcs1_v15() {
        let header = JwtHeader {
            alg: Algorithm::Rs256,
            typ: Some("JWT"),
            kid: Some("key-1"),
        };
        let claims = serde_json::json!({"iss": "sa@example.iam", "exp": NOW});
        let t = sign_jwt(&header, &claims, &keys().0).unwrap();
        assert_eq!(t, sign_jwt(&header, &claims, &keys().0).unwrap());
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(
            URL_SAFE_NO_PAD.decode(parts[0]).unwrap(),
            br#"{"alg":"RS256","typ":"JWT","kid":"key-1"}"#
        );
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signature = rsa::pkcs1v15::Signature::try_from(signature.as_slice()).unwrap();
        let input = &t.as_bytes()[..parts[0].len() + 1 + parts[1].len()];
        let verifier = rsa::pkcs1v15::VerifyingKey::<Sha256>::new(public());
        assert!(verifier.verify(input, &signature).is_ok());
        let other = rsa::pkcs1v15::VerifyingKey::<Sha256>::new(keys().1.to_public_key());
        assert!(other.verify(input, &signature).is_err());
        // A CDI token's header is `alg` alone, as before.
        let cdi = token(&Claims::upload("vms", "disk", NOW, DEFAULT_TTL));
        let h = URL_SAFE_NO_PAD
            .decode(cdi.split('.').next().unwrap())
            .unwrap();
        assert_eq!(h, br#"{"alg":"PS256"}"#);
    }

    #[test]
    fn expiry_is_checked_with_ten_seconds_of_leeway() {
        let t = token(&Claims::upload("vms", "disk", NOW, DEFAULT_TTL));
        assert!(verify(&t, &public(), NOW + 300 + 10).is_ok());
        let e = verify(&t, &public(), NOW + 300 + 11).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
        assert!(e.to_string().contains("expired"), "{e}");
        let early = verify(&t, &public(), NOW - 11).unwrap_err();
        assert_eq!(early.kind(), ErrorKind::Unauthorized);
    }

    #[test]
    fn another_key_or_a_tampered_payload_is_unauthorized() {
        let t = token(&Claims::upload("vms", "disk", NOW, DEFAULT_TTL));
        let other = keys().1.to_public_key();
        assert_eq!(
            verify(&t, &other, NOW).unwrap_err().kind(),
            ErrorKind::Unauthorized
        );
        let mut parts: Vec<String> = t.split('.').map(String::from).collect();
        let forged = Claims::upload("vms", "other", NOW, DEFAULT_TTL);
        parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        let e = verify(&parts.join("."), &public(), NOW).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    }

    #[test]
    fn alg_none_and_wrong_claims_are_unauthorized() {
        let claims = Claims::upload("vms", "disk", NOW, DEFAULT_TTL);
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap())
        );
        assert_eq!(
            verify(&none, &public(), NOW).unwrap_err().kind(),
            ErrorKind::Unauthorized
        );
        for tweak in [
            |c: &mut Claims| c.operation = "Clone".into(),
            |c: &mut Claims| c.iss = "someone".into(),
            |c: &mut Claims| c.resource.resource = "pods".into(),
            |c: &mut Claims| c.name.clear(),
        ] {
            let mut c = claims.clone();
            tweak(&mut c);
            let e = verify(&token(&c), &public(), NOW).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
        }
    }

    #[test]
    fn clone_claims_keep_their_params_and_are_not_upload_tokens() {
        let mut c = Claims::issued(
            OPERATION_CLONE,
            ("golden", "fedora"),
            Resource::default(),
            NOW,
            DEFAULT_TTL,
        );
        c.params.insert("targetName".into(), "vm".into());
        let t = token(&c);
        assert_eq!(verify_signed(&t, &public()).unwrap(), c);
        assert_eq!(
            verify(&t, &public(), NOW).unwrap_err().kind(),
            ErrorKind::Unauthorized
        );
        // Upload tokens carry no params field, as CDI's.
        let up = token(&Claims::upload("vms", "disk", NOW, DEFAULT_TTL));
        let payload = URL_SAFE_NO_PAD
            .decode(up.split('.').nth(1).unwrap())
            .unwrap();
        assert!(!String::from_utf8(payload).unwrap().contains("params"));
    }

    #[test]
    fn garbage_is_malformed() {
        for t in ["", "abc", "a.b", "a.b.c.d", "!!.??.**", "e30.e30"] {
            assert_eq!(
                verify(t, &public(), NOW).unwrap_err().kind(),
                ErrorKind::MalformedToken,
                "{t}"
            );
        }
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer("Bearer abc.def-_"), Some("abc.def-_"));
        assert_eq!(bearer("bearer   x"), Some("x"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearerabc"), None);
        assert_eq!(bearer("Bearer a b"), None);
        assert_eq!(bearer("Bearer a\"b"), None);
    }

    #[test]
    fn pem_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = private_and_public_pem(&keys().0).unwrap();
        std::fs::write(dir.path().join("k"), private).unwrap();
        std::fs::write(dir.path().join("p"), public).unwrap();
        let k = load_private_key(&dir.path().join("k")).unwrap();
        let p = load_public_key(&dir.path().join("p")).unwrap();
        let t = sign(&Claims::upload("a", "b", NOW, DEFAULT_TTL), &k).unwrap();
        assert!(verify(&t, &p, NOW).is_ok());
        let e = load_public_key(&dir.path().join("k")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}

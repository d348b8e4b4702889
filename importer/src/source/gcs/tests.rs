use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use testkit::gcs::{CLIENT_EMAIL, Grant, PRIVATE_KEY_ID, TokenEndpoint};

use super::*;
use crate::ErrorKind;

fn key(endpoint: &TokenEndpoint) -> ServiceAccountKey {
    ServiceAccountKey::from_json(endpoint.key_json().as_bytes(), "credentials.json").unwrap()
}

fn signed(signer: &TokenSigner) -> Result<String> {
    let mut headers = HeaderMap::new();
    let url = Url::parse("https://storage.googleapis.com/b/o").unwrap();
    signer.sign(&url, &mut headers)?;
    Ok(headers[header::AUTHORIZATION].to_str().unwrap().to_string())
}

#[test]
fn a_google_key_file_parses_and_errors_name_the_field() {
    let endpoint = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let k = key(&endpoint);
    assert_eq!(k.client_email, CLIENT_EMAIL);
    assert_eq!(k.private_key_id.as_deref(), Some(PRIVATE_KEY_ID));
    assert_eq!(k.token_uri, endpoint.uri());
    assert!(!format!("{k:?}").contains("PRIVATE KEY"), "{k:?}");

    // Each field set to a value (null: left out), and what the error says.
    let json: serde_json::Value = serde_json::from_str(&endpoint.key_json()).unwrap();
    let with = |field: &str, value: serde_json::Value| {
        let mut j = json.clone();
        j[field] = value;
        ServiceAccountKey::from_json(j.to_string().as_bytes(), "/google/credentials.json")
    };
    let no_uri = with("token_uri", serde_json::Value::Null).unwrap();
    assert_eq!(no_uri.token_uri, DEFAULT_TOKEN_URI);
    let bad_pem = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    for (field, value, needle) in [
        (
            "client_email",
            serde_json::Value::Null,
            "client_email is missing",
        ),
        ("private_key", "".into(), "private_key is missing"),
        ("private_key", bad_pem.into(), "holds no RSA private key"),
        ("type", "authorized_user".into(), "\"authorized_user\""),
        ("token_uri", "ftp://x/token".into(), "not an http(s) URL"),
    ] {
        let e = with(field, value).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        let text = e.to_string();
        assert!(text.contains(needle), "{text}");
        assert!(text.contains("/google/credentials.json"), "{text}");
    }
    let e = ServiceAccountKey::from_json(b"accessKeyId=x", "creds").unwrap_err();
    assert!(
        e.to_string().contains("not a service-account key file"),
        "{e}"
    );
    let e = ServiceAccountKey::from_file(Path::new("/nonexistent/credentials.json")).unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/credentials.json"),
        "{e}"
    );
}

#[test]
fn gs_and_cdi_urls_address_the_xml_api() {
    let o = GcsObject::parse("gs://bkt/dir/a b+c.img", None).unwrap();
    assert_eq!(
        o.url().as_str(),
        "https://storage.googleapis.com/bkt/dir/a%20b%2Bc.img"
    );
    assert_eq!(o.name(), "gs://bkt/dir/a b+c.img");
    for host in ["127.0.0.1:9023", "http://127.0.0.1:9023/"] {
        let o = GcsObject::parse("gs://bkt/x.qcow2", Some(host)).unwrap();
        assert_eq!(o.url().as_str(), "http://127.0.0.1:9023/bkt/x.qcow2");
        assert_eq!(o.name(), "gs://bkt/x.qcow2 at http://127.0.0.1:9023/");
    }
    let cdi = GcsObject::parse(
        "https://storage.cloud.google.com/bkt/dir/o%20x.img",
        Some("127.0.0.1:1"),
    )
    .unwrap();
    assert_eq!(cdi.endpoint.as_str(), "https://storage.cloud.google.com/");
    assert_eq!(
        (cdi.bucket.as_str(), cdi.object.as_str()),
        ("bkt", "dir/o x.img")
    );
    for bad in ["gs://bucket-only", "gs:///object", "ftp://h/b/o", "gs://é"] {
        let e = GcsObject::parse(bad, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}: {e}");
    }
}

#[test]
fn the_assertion_is_an_rs256_jwt_bearer_grant_for_the_read_only_scope() {
    let endpoint = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let signer = TokenSigner::new(&key(&endpoint), &HttpOptions::default()).unwrap();
    let jwt = signer.assertion(1_800_000_000).unwrap();
    let part = |i: usize| {
        URL_SAFE_NO_PAD
            .decode(jwt.split('.').nth(i).unwrap())
            .unwrap()
    };
    let header: serde_json::Value = serde_json::from_slice(&part(0)).unwrap();
    assert_eq!(
        header,
        serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": PRIVATE_KEY_ID})
    );
    let claims: AssertionClaims = serde_json::from_slice(&part(1)).unwrap();
    assert_eq!(
        claims,
        AssertionClaims {
            iss: CLIENT_EMAIL.into(),
            scope: READ_ONLY_SCOPE.into(),
            aud: endpoint.uri(),
            iat: 1_800_000_000,
            exp: 1_800_003_600,
        }
    );
}

/// One token serves every request until it is due or refused; the endpoint verified each
/// assertion (signature by openssl, claims).
#[test]
fn a_token_is_asked_once_and_renewed_when_refused_or_due() {
    let endpoint = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let signer = TokenSigner::new(&key(&endpoint), &HttpOptions::default()).unwrap();
    assert_eq!(signed(&signer).unwrap(), "Bearer token-1");
    assert_eq!(signed(&signer).unwrap(), "Bearer token-1");
    assert!(signer.renew(None).unwrap());
    assert_eq!(signed(&signer).unwrap(), "Bearer token-2");
    let outcomes: Vec<_> = endpoint.requests().into_iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Ok("token-1".into()), Ok("token-2".into())]);

    // A token that expires at once is due at every request.
    let short = TokenEndpoint::start(Grant::Verify { expires_in: 0 });
    let signer = TokenSigner::new(&key(&short), &HttpOptions::default()).unwrap();
    assert_eq!(signed(&signer).unwrap(), "Bearer token-1");
    assert_eq!(signed(&signer).unwrap(), "Bearer token-2");
}

#[test]
fn a_refusal_is_terminal_and_names_the_endpoint_s_reason() {
    let body = r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#;
    let refusing = TokenEndpoint::start(Grant::Refuse {
        status: 400,
        body: body.into(),
    });
    let signer = TokenSigner::new(&key(&refusing), &HttpOptions::default()).unwrap();
    let e = signed(&signer).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SourceRejected, "{e}");
    let text = e.to_string();
    for needle in [
        "400",
        "Invalid JWT Signature.",
        CLIENT_EMAIL,
        &refusing.uri(),
    ] {
        assert!(text.contains(needle), "{needle} missing: {text}");
    }
    // A busy endpoint, and one that is gone, are worth another attempt.
    let busy = TokenEndpoint::start(Grant::Refuse {
        status: 503,
        body: "{}".into(),
    });
    let signer = TokenSigner::new(&key(&busy), &HttpOptions::default()).unwrap();
    assert_eq!(
        signed(&signer).unwrap_err().kind(),
        ErrorKind::SourceUnavailable
    );
    let gone = key(&busy);
    drop(busy);
    let signer = TokenSigner::new(&gone, &HttpOptions::default()).unwrap();
    assert_eq!(
        signed(&signer).unwrap_err().kind(),
        ErrorKind::SourceUnavailable
    );
}

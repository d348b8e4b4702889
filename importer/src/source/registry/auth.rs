//! Registry authentication: credentials (basic, or a Docker `config.json` as Kubernetes pull
//! secrets hold), `WWW-Authenticate` challenges, and bearer tokens from a token service.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use reqwest::header::HeaderValue;
use serde::Deserialize;

use crate::error::{Error, Result};

/// `(user, password)` for basic auth and token requests.
pub type Basic = (String, String);

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The credentials for `registry` (`host[:port]`) in a Docker `config.json`-style file
/// (`{"auths": {"HOST": {"auth": base64("user:pass")}}}` or `username`/`password`); keys may
/// carry a scheme and a path (`https://index.docker.io/v1/`). None when the file has no entry.
pub fn from_auth_file(path: &Path, registry: &str) -> Result<Option<Basic>> {
    let text = std::fs::read(path).map_err(|e| {
        Error::io(
            format!("reading the registry auth file {}", path.display()),
            e,
        )
    })?;
    let cfg: ConfigFile = serde_json::from_slice(&text).map_err(|e| {
        Error::InvalidInput(format!(
            "registry auth file {} is not a Docker config.json: {e}",
            path.display()
        ))
    })?;
    let wanted = aliases(registry);
    let Some(entry) = cfg
        .auths
        .iter()
        .find(|(k, _)| wanted.contains(&normalize_key(k)))
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(Some((u.clone(), p.clone())));
    }
    let encoded = entry.auth.as_deref().unwrap_or("");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
        })
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "registry auth file {}: the entry for {registry} has no username/password and no \
                 base64 user:password auth",
                path.display()
            ))
        })?;
    Ok(Some(decoded))
}

fn normalize_key(k: &str) -> String {
    let k = k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
        .unwrap_or(k);
    k.split('/').next().unwrap_or(k).to_ascii_lowercase()
}

fn aliases(registry: &str) -> Vec<String> {
    let r = registry.to_ascii_lowercase();
    if r == super::reference::DOCKER_HUB {
        vec![r, "index.docker.io".into(), "docker.io".into()]
    } else {
        vec![r]
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Lower-case scheme: `basic` or `bearer`.
    pub scheme: String,
    pub params: BTreeMap<String, String>,
}

/// Parses `Scheme k="v", k2=v2` (quoted values may hold commas and escaped quotes).
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.trim().is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek() {
                if *c == ',' {
                    break;
                }
                value.push(*c);
                chars.next();
            }
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

/// True for a `Bearer ...` challenge.
pub fn is_bearer(challenge: &str) -> bool {
    challenge
        .trim_start()
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("bearer"))
}

/// `Authorization: Basic ...`.
pub fn basic_header(creds: &Basic) -> Result<HeaderValue> {
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", creds.0, creds.1));
    header_value(&format!("Basic {token}"))
}

pub fn header_value(v: &str) -> Result<HeaderValue> {
    let mut h = HeaderValue::from_str(v)
        .map_err(|e| Error::InvalidInput(format!("credentials unusable in a header: {e}")))?;
    h.set_sensitive(true);
    Ok(h)
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// The bearer token in a token service's JSON answer (`token`, or OAuth2's `access_token`).
pub fn parse_token(body: &[u8]) -> Result<String> {
    let t: TokenAnswer = serde_json::from_slice(body)
        .map_err(|e| Error::SourceRejected(format!("token service answer is not JSON: {e}")))?;
    t.token
        .or(t.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::SourceRejected("token service answered without a token".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="reg, 1",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example/token");
        assert_eq!(c.params["service"], "reg, 1");
        assert_eq!(c.params["scope"], "repository:a/b:pull");
        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(
            (c.scheme.as_str(), c.params["realm"].as_str()),
            ("basic", "Registry Realm")
        );
        assert_eq!(parse_challenge("Basic").unwrap().params.len(), 0);
        assert!(is_bearer(" bearer realm=x") && !is_bearer("Basic") && !is_bearer("Bear"));
    }

    #[test]
    fn auth_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("al:pw:x");
        std::fs::write(
            &f,
            format!(
                r#"{{"auths":{{"https://127.0.0.1:5000/v2/":{{"auth":"{b64}"}},"https://index.docker.io/v1/":{{"username":"u","password":"p"}}}}}}"#
            ),
        )
        .unwrap();
        assert_eq!(
            from_auth_file(&f, "127.0.0.1:5000").unwrap(),
            Some(("al".into(), "pw:x".into()))
        );
        assert_eq!(
            from_auth_file(&f, super::super::reference::DOCKER_HUB).unwrap(),
            Some(("u".into(), "p".into()))
        );
        assert_eq!(from_auth_file(&f, "other.io").unwrap(), None);
        std::fs::write(&f, "not json").unwrap();
        assert!(from_auth_file(&f, "x").is_err());
    }

    #[test]
    fn tokens() {
        assert_eq!(parse_token(br#"{"token":"t1"}"#).unwrap(), "t1");
        assert_eq!(parse_token(br#"{"access_token":"t2"}"#).unwrap(), "t2");
        assert!(parse_token(b"{}").is_err());
    }
}

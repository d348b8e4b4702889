//! Who is asking, as an aggregated API server learns it: the kube-apiserver's front proxy
//! connects with a client certificate signed by the request-header CA (and, when names are
//! configured, with one of the allowed common names), and tells the user, groups and extras in
//! `X-Remote-*` headers. Nothing else is trusted: a request without such a certificate is not
//! authenticated, whatever headers it carries.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

/// The front-proxy settings (the `requestheader-*` keys of the `extension-apiserver-authentication`
/// ConfigMap in `kube-system`, or the flags of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderConfig {
    /// Common names the proxy's certificate may have; empty: any name the CA signed.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefix: Vec<String>,
}

impl Default for RequestHeaderConfig {
    fn default() -> Self {
        RequestHeaderConfig {
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_headers_prefix: vec!["X-Remote-Extra-".into()],
        }
    }
}

impl RequestHeaderConfig {
    /// Reads the ConfigMap's data (its lists are JSON arrays of strings); returns the settings and
    /// the request-header CA bundle (PEM).
    pub fn from_configmap(
        data: &BTreeMap<String, String>,
    ) -> Result<(RequestHeaderConfig, String), String> {
        let ca = data
            .get("requestheader-client-ca-file")
            .filter(|ca| !ca.trim().is_empty())
            .ok_or("the ConfigMap has no requestheader-client-ca-file: the API server runs without front-proxy authentication (--requestheader-client-ca-file)")?
            .clone();
        let list = |key: &str, default: Vec<String>| -> Result<Vec<String>, String> {
            match data.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) {
                None => Ok(default),
                Some(v) => serde_json::from_str(v).map_err(|e| format!("{key}: {e}")),
            }
        };
        let defaults = RequestHeaderConfig::default();
        Ok((
            RequestHeaderConfig {
                allowed_names: list("requestheader-allowed-names", Vec::new())?,
                username_headers: list(
                    "requestheader-username-headers",
                    defaults.username_headers,
                )?,
                group_headers: list("requestheader-group-headers", defaults.group_headers)?,
                extra_headers_prefix: list(
                    "requestheader-extra-headers-prefix",
                    defaults.extra_headers_prefix,
                )?,
            },
            ca,
        ))
    }

    /// Whether a verified client certificate with this common name is the front proxy.
    pub fn allows(&self, common_name: Option<&str>) -> bool {
        self.allowed_names.is_empty()
            || common_name.is_some_and(|cn| self.allowed_names.iter().any(|n| n == cn))
    }

    /// The user the proxy speaks for, from the request headers.
    pub fn identity(&self, headers: &HeaderMap) -> Result<Identity, String> {
        let values = |name: &str| -> Vec<String> {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_string)
                .collect()
        };
        let user = self
            .username_headers
            .iter()
            .flat_map(|h| values(h))
            .find(|u| !u.is_empty())
            .ok_or_else(|| {
                format!(
                    "one of these headers required for authorization: {}",
                    self.username_headers.join(", ")
                )
            })?;
        let groups = self.group_headers.iter().flat_map(|h| values(h)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let name = name.as_str();
            let Some(key) = self.extra_headers_prefix.iter().find_map(|p| {
                name.get(..p.len())
                    .filter(|head| head.eq_ignore_ascii_case(p))
                    .map(|_| &name[p.len()..])
            }) else {
                continue;
            };
            // Extra keys are percent-encoded in header names (`X-Remote-Extra-Scopes%2Fa`).
            if let Ok(v) = value.to_str() {
                extra
                    .entry(netkit::percent_decode(key).to_ascii_lowercase())
                    .or_default()
                    .push(v.to_string());
            }
        }
        Ok(Identity {
            user,
            groups,
            extra,
        })
    }
}

/// A user as the front proxy names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The SubjectAccessReview asking whether this user may `create` `resource` of the upload
    /// group in `namespace`.
    pub fn access_review(
        &self,
        namespace: &str,
        group: &str,
        version: &str,
        resource: &str,
    ) -> SubjectAccessReview {
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(self.user.clone()),
                groups: Some(self.groups.clone()),
                extra: (!self.extra.is_empty()).then(|| self.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.into()),
                    verb: Some("create".into()),
                    group: Some(group.into()),
                    version: Some(version.into()),
                    resource: Some(resource.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// The subject common name (OID 2.5.4.3) of a DER X.509 certificate, read with a minimal DER
/// walk: Certificate → tbsCertificate → [version], serial, signature, issuer, validity, subject.
pub fn common_name(cert_der: &[u8]) -> Option<String> {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    let (_, cert, _) = tlv(cert_der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    // Skip the optional [0] version, then serial, signature algorithm, issuer and validity.
    let (tag, _, rest) = tlv(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (_, mut subject, _) = tlv(tbs)?;
    while !subject.is_empty() {
        let (_, set, rest) = tlv(subject)?;
        subject = rest;
        let (_, attribute, _) = tlv(set)?;
        let (_, oid, value) = tlv(attribute)?;
        if oid == CN {
            let (_, text, _) = tlv(value)?;
            return String::from_utf8(text.to_vec()).ok();
        }
    }
    None
}

/// One DER element: `(tag, contents, rest)`.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{self, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_user_groups_and_extras_come_from_the_configured_headers() {
        let cfg = RequestHeaderConfig::default();
        let id = cfg
            .identity(&headers(&[
                ("X-Remote-User", "alice"),
                ("X-Remote-Group", "devs"),
                ("X-Remote-Group", "system:authenticated"),
                ("X-Remote-Extra-Scopes%2Fa", "one"),
                ("x-remote-extra-scopes%2fa", "two"),
            ]))
            .unwrap();
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, ["devs", "system:authenticated"]);
        assert_eq!(id.extra["scopes/a"], ["one", "two"]);
    }

    #[test]
    fn a_request_without_a_user_header_is_refused_naming_the_headers() {
        let cfg = RequestHeaderConfig::default();
        let e = cfg
            .identity(&headers(&[("X-Remote-Group", "devs")]))
            .unwrap_err();
        assert!(e.contains("X-Remote-User"), "{e}");
    }

    #[test]
    fn allowed_names_bind_the_proxy_certificate() {
        let mut cfg = RequestHeaderConfig::default();
        assert!(cfg.allows(Some("anyone")));
        cfg.allowed_names = vec!["front-proxy-client".into()];
        assert!(cfg.allows(Some("front-proxy-client")));
        assert!(!cfg.allows(Some("mallory")));
        assert!(!cfg.allows(None));
    }

    #[test]
    fn the_configmap_lists_are_json() {
        let data: BTreeMap<String, String> = [
            ("requestheader-client-ca-file", "PEM"),
            ("requestheader-allowed-names", "[\"front-proxy-client\"]"),
            ("requestheader-username-headers", "[\"X-Remote-User\"]"),
            ("requestheader-group-headers", "[\"X-Remote-Group\"]"),
            (
                "requestheader-extra-headers-prefix",
                "[\"X-Remote-Extra-\"]",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (cfg, ca) = RequestHeaderConfig::from_configmap(&data).unwrap();
        assert_eq!(ca, "PEM");
        assert_eq!(cfg.allowed_names, ["front-proxy-client"]);
        let mut broken = data.clone();
        broken.insert("requestheader-allowed-names".into(), "front".into());
        assert!(RequestHeaderConfig::from_configmap(&broken).is_err());
        broken.remove("requestheader-client-ca-file");
        let e = RequestHeaderConfig::from_configmap(&broken).unwrap_err();
        assert!(e.contains("requestheader-client-ca-file"), "{e}");
    }

    #[test]
    fn the_review_asks_for_create_in_the_namespace() {
        let id = Identity {
            user: "alice".into(),
            groups: vec!["devs".into()],
            extra: BTreeMap::new(),
        };
        let sar = id.access_review(
            "ns1",
            "upload.cdi.kubevirt.io",
            "v1beta1",
            "uploadtokenrequests",
        );
        let attrs = sar.spec.resource_attributes.unwrap();
        assert_eq!(attrs.verb.as_deref(), Some("create"));
        assert_eq!(attrs.namespace.as_deref(), Some("ns1"));
        assert_eq!(attrs.resource.as_deref(), Some("uploadtokenrequests"));
        assert_eq!(sar.spec.user.as_deref(), Some("alice"));
        assert_eq!(sar.spec.extra, None);
    }

    #[test]
    fn der_walks_refuse_garbage() {
        assert_eq!(common_name(&[]), None);
        assert_eq!(common_name(&[0x30, 0x82, 0xff]), None);
        assert_eq!(common_name(&[0x30, 0x03, 0x02, 0x01]), None);
    }
}

//! The cert controller's decisions, as a pure function: from the Secrets and bundle ConfigMaps
//! that exist, the time and the configured lifetimes, what to write and when to look again.
//!
//! The rules are those of CDI's cert manager (OpenShift's library-go cert rotation):
//! - a signer (self-signed CA) or a certificate is made anew when it is missing or damaged, when
//!   less than `renewBefore` of its life remains, or when it outlives the configured `duration`
//!   (the duration was shortened);
//! - a bundle holds the current signer and every older one that has not expired, so clients
//!   keep trusting certificates the old signer issued while they are rolled;
//! - a certificate is re-issued when its issuer is no longer the current signer (after a signer
//!   renewal), and never outlives its signer.

use std::collections::BTreeMap;
use std::time::Duration;

use super::pki::{self, CertInfo, Pair, Usage};
use api::duration::parse_go_duration;
use api::hyperconverged::{CertConfig, CertRotation};
use api::names::{secret, service};
use kubekit::error::Result;

/// CDI's common name of the upload proxy's client certificate (upload servers check it).
pub const UPLOAD_PROXY_CLIENT_NAME: &str = "client.upload-server.cdi.kubevirt.io";
/// Secret data keys: a `kubernetes.io/tls` pair, and the upload token key's public half.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const PUBLIC_PEM: &str = "public.pem";
/// Secret types.
pub const TYPE_TLS: &str = "kubernetes.io/tls";
pub const TYPE_OPAQUE: &str = "Opaque";

/// A certificate's lifetime and how long before its end it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub duration: Duration,
    /// Shorter than `duration` (see [`Durations::from_cert_config`]).
    pub renew_before: Duration,
}

/// The lifetimes of signers and of the certificates they sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durations {
    pub ca: Lifetime,
    pub server: Lifetime,
}

impl Default for Durations {
    /// HCO's defaults: CA 48h renewed 24h before its end, server 24h renewed 12h before.
    fn default() -> Self {
        let h = |n: u64| Duration::from_secs(n * 3600);
        Durations {
            ca: Lifetime {
                duration: h(48),
                renew_before: h(24),
            },
            server: Lifetime {
                duration: h(24),
                renew_before: h(12),
            },
        }
    }
}

impl Durations {
    /// The lifetimes of a `CDI` CR's `spec.certConfig`, unset fields taking the defaults.
    /// Refused: a value that is not a Go duration, or `renewBefore` not shorter than `duration`
    /// (every certificate would be due as soon as made).
    pub fn from_cert_config(config: &CertConfig) -> std::result::Result<Durations, String> {
        let defaults = Durations::default();
        let one = |given: &Option<CertRotation>, default: Lifetime, what: &str| {
            let given = given.clone().unwrap_or_default();
            let parse = |v: &Option<String>, field: &str, default: Duration| match v {
                None => Ok(default),
                Some(s) => parse_go_duration(s)
                    .ok()
                    .filter(|d| *d > 0.0)
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        format!("certConfig.{what}.{field}: {s:?} is not a positive duration")
                    }),
            };
            let life = Lifetime {
                duration: parse(&given.duration, "duration", default.duration)?,
                renew_before: parse(&given.renew_before, "renewBefore", default.renew_before)?,
            };
            if life.renew_before >= life.duration {
                return Err(format!(
                    "certConfig.{what}: renewBefore ({:?}) must be shorter than duration ({:?})",
                    life.renew_before, life.duration
                ));
            }
            Ok(life)
        };
        Ok(Durations {
            ca: one(&config.ca, defaults.ca, "ca")?,
            server: one(&config.server, defaults.server, "server")?,
        })
    }
}

/// A Secret's data, as text.
pub type Data = BTreeMap<String, String>;

/// What exists in the namespace: Secret data and bundle ConfigMap texts, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    pub secrets: BTreeMap<String, Data>,
    pub bundles: BTreeMap<String, String>,
}

/// One Secret to write whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretWrite {
    pub name: String,
    pub type_: &'static str,
    pub data: Data,
    /// Why it is written, for the log.
    pub why: &'static str,
}

/// What to write, in this order: signers, bundles, then the certificates (so a client reading
/// the bundle trusts a renewed signer before anything it signed is served).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub signers: Vec<SecretWrite>,
    /// Bundle ConfigMaps to write: name, PEM text.
    pub bundles: Vec<(String, String)>,
    pub certs: Vec<SecretWrite>,
    /// The API server signer's bundle, the `caBundle` of the APIServices and webhooks.
    pub api_ca_bundle: String,
    /// When something is next due (Unix seconds): a renewal, or an old CA leaving a bundle.
    pub next: i64,
}

impl Plan {
    /// Whether nothing needs writing.
    pub fn is_empty(&self) -> bool {
        self.signers.is_empty() && self.bundles.is_empty() && self.certs.is_empty()
    }
}

/// A certificate one signer issues, kept in a Secret.
struct Leaf {
    secret: &'static str,
    usage: LeafUsage,
}

enum LeafUsage {
    /// Serving certificate for this Service.
    Serves(&'static str),
    /// Client certificate with this common name.
    Client(&'static str),
}

/// A signer, its bundle and what it signs here (the upload server signer signs per-pod
/// certificates, issued by the DataVolume controller).
struct Signer {
    secret: &'static str,
    bundle: &'static str,
    leaves: &'static [Leaf],
}

const SIGNERS: &[Signer] = &[
    Signer {
        secret: secret::APISERVER_SIGNER,
        bundle: secret::APISERVER_SIGNER_BUNDLE,
        leaves: &[
            Leaf {
                secret: secret::APISERVER_CERT,
                usage: LeafUsage::Serves(service::APISERVER),
            },
            Leaf {
                secret: secret::HYPERCONVERGED_WEBHOOK_CERT,
                usage: LeafUsage::Serves(service::HYPERCONVERGED_WEBHOOK),
            },
        ],
    },
    Signer {
        secret: secret::UPLOAD_PROXY_SIGNER,
        bundle: secret::UPLOAD_PROXY_SIGNER_BUNDLE,
        leaves: &[Leaf {
            secret: secret::UPLOAD_PROXY_CERT,
            usage: LeafUsage::Serves(service::UPLOAD_PROXY),
        }],
    },
    Signer {
        secret: secret::UPLOAD_SERVER_SIGNER,
        bundle: secret::UPLOAD_SERVER_SIGNER_BUNDLE,
        leaves: &[],
    },
    Signer {
        secret: secret::UPLOAD_SERVER_CLIENT_SIGNER,
        bundle: secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE,
        leaves: &[Leaf {
            secret: secret::UPLOAD_PROXY_CLIENT_CERT,
            usage: LeafUsage::Client(UPLOAD_PROXY_CLIENT_NAME),
        }],
    },
];

/// The Secrets this controller reads and writes.
pub fn secret_names() -> Vec<&'static str> {
    let mut names = vec![secret::UPLOAD_TOKEN_KEY];
    for s in SIGNERS {
        names.push(s.secret);
        names.extend(s.leaves.iter().map(|l| l.secret));
    }
    names
}

/// The bundle ConfigMaps this controller reads and writes.
pub fn bundle_names() -> Vec<&'static str> {
    SIGNERS.iter().map(|s| s.bundle).collect()
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// When a certificate is to be renewed.
fn renew_at(cert: &CertInfo, life: &Lifetime) -> i64 {
    cert.not_after.saturating_sub(secs(life.renew_before))
}

/// Why a valid-looking certificate must be renewed now, if it must.
fn due(cert: &CertInfo, now: i64, life: &Lifetime) -> Option<&'static str> {
    if now >= renew_at(cert, life) {
        Some("less than renewBefore of its life remains")
    } else if cert.not_after.saturating_sub(now) > secs(life.duration) {
        Some("it outlives the configured duration")
    } else {
        None
    }
}

/// The pair of a `kubernetes.io/tls` Secret, if both halves parse.
fn pair_of(data: Option<&Data>) -> Option<(Pair, CertInfo)> {
    let data = data?;
    let (cert, key) = (data.get(TLS_CRT)?, data.get(TLS_KEY)?);
    let info = pki::parse_cert(cert)?;
    pki::key_parses(key).then(|| {
        (
            Pair {
                cert: cert.clone(),
                key: key.clone(),
            },
            info,
        )
    })
}

fn tls_data(pair: &Pair) -> Data {
    Data::from([
        (TLS_CRT.to_string(), pair.cert.clone()),
        (TLS_KEY.to_string(), pair.key.clone()),
    ])
}

/// A bundle: the current signer first, then every other CA of `existing` not yet expired.
/// Returns the PEM text and the earliest expiry among the older CAs kept.
pub fn merge_bundle(existing: &str, signer: &CertInfo, now: i64) -> (String, Option<i64>) {
    let mut kept: Vec<CertInfo> = vec![signer.clone()];
    for c in pki::parse_certs(existing) {
        if c.not_after > now && !kept.iter().any(|k| k.der == c.der) {
            kept.push(c);
        }
    }
    let text = kept.iter().map(|c| pki::pem_of(&c.der)).collect();
    (text, kept[1..].iter().map(|c| c.not_after).min())
}

/// What to write, given what exists, the time (Unix seconds) and the lifetimes.
pub fn plan(current: &Current, now: i64, durations: &Durations, namespace: &str) -> Result<Plan> {
    let mut plan = Plan {
        signers: Vec::new(),
        bundles: Vec::new(),
        certs: Vec::new(),
        api_ca_bundle: String::new(),
        next: i64::MAX,
    };
    for signer in SIGNERS {
        let existing = pair_of(current.secrets.get(signer.secret));
        let why = match &existing {
            None => Some("missing or damaged"),
            Some((_, info)) => due(info, now, &durations.ca),
        };
        let (pair, info) = match (existing, why) {
            (Some(found), None) => found,
            (_, why) => {
                let cn = format!("{namespace}_{}@{now}", signer.secret);
                let pair = pki::make_signer(&cn, now, durations.ca.duration)?;
                let info = pki::parse_cert(&pair.cert).ok_or_else(|| {
                    kubekit::Error::Certificate(format!("the new signer {cn} does not parse"))
                })?;
                plan.signers.push(SecretWrite {
                    name: signer.secret.into(),
                    type_: TYPE_TLS,
                    data: tls_data(&pair),
                    why: why.unwrap_or_default(),
                });
                (pair, info)
            }
        };
        plan.next = plan.next.min(renew_at(&info, &durations.ca));

        let existing_bundle = current.bundles.get(signer.bundle);
        let (bundle, old_expiry) =
            merge_bundle(existing_bundle.map_or("", String::as_str), &info, now);
        if let Some(t) = old_expiry {
            plan.next = plan.next.min(t);
        }
        if existing_bundle != Some(&bundle) {
            plan.bundles.push((signer.bundle.into(), bundle.clone()));
        }
        if signer.secret == secret::APISERVER_SIGNER {
            plan.api_ca_bundle = bundle;
        }

        for leaf in signer.leaves {
            let usage = match leaf.usage {
                LeafUsage::Serves(svc) => Usage::Server(pki::service_dns_names(svc, namespace)),
                LeafUsage::Client(cn) => Usage::Client(cn.into()),
            };
            let existing = pair_of(current.secrets.get(leaf.secret));
            let why = match &existing {
                None => Some("missing or damaged"),
                Some((_, c)) if !c.issued_by(&info) => Some("its signer was renewed"),
                Some((_, c)) if matches!(&usage, Usage::Server(n) if *n != c.dns_names) => {
                    Some("its DNS names changed")
                }
                // A certificate that ends with its signer is renewed with the signer:
                // re-issuing it sooner would give it the same end.
                Some((_, c)) if c.not_after >= info.not_after => None,
                Some((_, c)) => due(c, now, &durations.server),
            };
            let leaf_info = match (existing, why) {
                (Some((_, c)), None) => c,
                (_, why) => {
                    let not_after = now
                        .saturating_add(secs(durations.server.duration))
                        .min(info.not_after);
                    let made = pki::make_signed(&pair, &usage, now, not_after)?;
                    let c = pki::parse_cert(&made.cert).ok_or_else(|| {
                        kubekit::Error::Certificate(format!(
                            "the new {} does not parse",
                            leaf.secret
                        ))
                    })?;
                    plan.certs.push(SecretWrite {
                        name: leaf.secret.into(),
                        type_: TYPE_TLS,
                        data: tls_data(&made),
                        why: why.unwrap_or_default(),
                    });
                    c
                }
            };
            if leaf_info.not_after < info.not_after {
                plan.next = plan.next.min(renew_at(&leaf_info, &durations.server));
            }
        }
    }
    if let Some(write) = token_key(current.secrets.get(secret::UPLOAD_TOKEN_KEY))? {
        plan.certs.push(write);
    }
    plan.next = plan.next.max(now + 1);
    Ok(plan)
}

/// The key of the client CA bundle in an upload server's Secret.
pub const CA_CRT: &str = "ca.crt";

/// What an upload server's Secret needs: data to write (None: it is current), and when to
/// look again (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadSecret {
    pub write: Option<Data>,
    pub next: i64,
}

/// How soon to look again at a certificate whose renewal waits on another controller.
const RECHECK: i64 = 60;

/// The Secret data of one upload server (CDI's per-pod certificate): a serving certificate for
/// the upload Service `service` in `namespace` issued by `signer` (never outliving it), and the
/// upload proxy's client CA bundle as `ca.crt`. Nothing is written while `existing` holds a
/// certificate of that signer for those names, not due, and that bundle. The next look is the
/// certificate's renewal, or its signer's when it ends with its signer (the cert controller
/// renews the signer then, and the certificate follows).
pub fn upload_server_secret(
    existing: Option<&Data>,
    signer: &Pair,
    client_bundle: &str,
    (service, namespace): (&str, &str),
    now: i64,
    durations: &Durations,
) -> Result<UploadSecret> {
    let signer_info = pki::parse_cert(&signer.cert).ok_or_else(|| {
        kubekit::Error::Certificate("the upload server signer does not parse".into())
    })?;
    let life = &durations.server;
    let names = pki::service_dns_names(service, namespace);
    let next_for = |c: &CertInfo| {
        let at = if c.not_after >= signer_info.not_after {
            renew_at(&signer_info, &durations.ca)
        } else {
            renew_at(c, life)
        };
        at.max(now + RECHECK)
    };
    let current = pair_of(existing).map(|(_, c)| c).filter(|c| {
        c.issued_by(&signer_info)
            && c.dns_names == names
            && (c.not_after >= signer_info.not_after || due(c, now, life).is_none())
            && existing.and_then(|d| d.get(CA_CRT)).map(String::as_str) == Some(client_bundle)
    });
    if let Some(c) = current {
        return Ok(UploadSecret {
            write: None,
            next: next_for(&c),
        });
    }
    let not_after = now
        .saturating_add(secs(life.duration))
        .min(signer_info.not_after);
    let made = pki::make_signed(signer, &Usage::Server(names), now, not_after)?;
    let info = pki::parse_cert(&made.cert).ok_or_else(|| {
        kubekit::Error::Certificate("the new upload server certificate does not parse".into())
    })?;
    let mut data = tls_data(&made);
    data.insert(CA_CRT.into(), client_bundle.into());
    Ok(UploadSecret {
        write: Some(data),
        next: next_for(&info),
    })
}

/// The upload token key pair, made when missing or damaged (never rotated: a token lives
/// minutes, and CDI keeps its signing key too).
fn token_key(data: Option<&Data>) -> Result<Option<SecretWrite>> {
    let sound = data.is_some_and(|d| {
        let key = d
            .get(TLS_KEY)
            .and_then(|k| token::private_key_from_pem(k, secret::UPLOAD_TOKEN_KEY).ok());
        let public = key.and_then(|k| token::public_key_pem(&k).ok());
        public.is_some() && public.as_ref() == d.get(PUBLIC_PEM)
    });
    if sound {
        return Ok(None);
    }
    let (private, public) =
        token::generate().map_err(|e| kubekit::Error::Certificate(netkit::error::chain(&e)))?;
    Ok(Some(SecretWrite {
        name: secret::UPLOAD_TOKEN_KEY.into(),
        type_: TYPE_OPAQUE,
        data: Data::from([(TLS_KEY.into(), private), (PUBLIC_PEM.into(), public)]),
        why: "missing or damaged",
    }))
}

#[cfg(test)]
mod tests;

//! One test per rotation rule of [`super::plan`].

use super::*;

const NS: &str = "quarry";
const T0: i64 = 1_800_000_000;
const HOUR: i64 = 3600;

/// `current` after the plan's writes.
fn apply(current: &Current, plan: &Plan) -> Current {
    let mut next = current.clone();
    for w in plan.signers.iter().chain(&plan.certs) {
        next.secrets.insert(w.name.clone(), w.data.clone());
    }
    for (name, text) in &plan.bundles {
        next.bundles.insert(name.clone(), text.clone());
    }
    next
}

/// Everything made at T0 with the default lifetimes.
fn made() -> Current {
    let plan = plan(&Current::default(), T0, &Durations::default(), NS).unwrap();
    apply(&Current::default(), &plan)
}

fn cert(current: &Current, name: &str) -> CertInfo {
    pki::parse_cert(&current.secrets[name][TLS_CRT]).unwrap()
}

fn written(writes: &[SecretWrite]) -> Vec<&str> {
    writes.iter().map(|w| w.name.as_str()).collect()
}

#[test]
fn an_empty_namespace_gets_every_signer_bundle_certificate_and_the_token_key() {
    let p = plan(&Current::default(), T0, &Durations::default(), NS).unwrap();
    let mut all: Vec<&str> = written(&p.signers);
    all.extend(written(&p.certs));
    all.sort();
    let mut expected = secret_names();
    expected.sort();
    assert_eq!(all, expected);
    let bundles: Vec<&str> = p.bundles.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(bundles, bundle_names());
    let now = apply(&Current::default(), &p);
    let token = &now.secrets[secret::UPLOAD_TOKEN_KEY];
    let key = token::private_key_from_pem(&token[TLS_KEY], "test").unwrap();
    assert_eq!(token::public_key_pem(&key).unwrap(), token[PUBLIC_PEM]);
}

#[test]
fn certificates_are_signed_by_their_signer_and_serve_the_service_dns_names() {
    let now = made();
    let signer = cert(&now, secret::APISERVER_SIGNER);
    let server = cert(&now, secret::APISERVER_CERT);
    assert!(server.issued_by(&signer));
    assert_eq!(
        server.dns_names,
        [
            "quarry-apiserver",
            "quarry-apiserver.quarry",
            "quarry-apiserver.quarry.svc",
            "quarry-apiserver.quarry.svc.cluster.local"
        ]
    );
    let client = cert(&now, secret::UPLOAD_PROXY_CLIENT_CERT);
    assert!(client.issued_by(&cert(&now, secret::UPLOAD_SERVER_CLIENT_SIGNER)));
    assert_eq!(server.not_after, T0 + 24 * HOUR);
    assert_eq!(signer.not_after, T0 + 48 * HOUR);
}

#[test]
fn nothing_is_written_while_nothing_is_due_and_the_next_look_is_the_first_renewal() {
    let now = made();
    let p = plan(&now, T0 + HOUR, &Durations::default(), NS).unwrap();
    assert!(p.is_empty(), "{p:?}");
    // Server certificates: 24h lifetime, renewed 12h before their end.
    assert_eq!(p.next, T0 + 12 * HOUR);
    assert_eq!(
        p.api_ca_bundle,
        now.bundles[secret::APISERVER_SIGNER_BUNDLE]
    );
}

#[test]
fn a_certificate_with_less_than_renew_before_left_is_reissued_by_the_same_signer() {
    let now = made();
    let p = plan(&now, T0 + 12 * HOUR, &Durations::default(), NS).unwrap();
    assert!(p.signers.is_empty() && p.bundles.is_empty(), "{p:?}");
    assert!(written(&p.certs).contains(&secret::APISERVER_CERT));
    let after = apply(&now, &p);
    assert!(cert(&after, secret::APISERVER_CERT).issued_by(&cert(&now, secret::APISERVER_SIGNER)));
    assert_eq!(
        cert(&after, secret::APISERVER_CERT).not_after,
        T0 + 36 * HOUR
    );
}

#[test]
fn a_renewed_signer_joins_its_bundle_beside_the_old_one_and_its_certificates_are_reissued() {
    let now = made();
    let old = cert(&now, secret::APISERVER_SIGNER);
    // 25h later: the CA (48h, renewed 24h before) is due; the server certs were renewed at 12h
    // in real life, but here they are still the first ones, signed by the old CA.
    let at = T0 + 25 * HOUR;
    let p = plan(&now, at, &Durations::default(), NS).unwrap();
    assert!(written(&p.signers).contains(&secret::APISERVER_SIGNER));
    let after = apply(&now, &p);
    let new = cert(&after, secret::APISERVER_SIGNER);
    assert_ne!(new.der, old.der);
    let bundle = pki::parse_certs(&after.bundles[secret::APISERVER_SIGNER_BUNDLE]);
    assert_eq!(bundle, vec![new.clone(), old.clone()]);
    assert_eq!(
        p.api_ca_bundle,
        after.bundles[secret::APISERVER_SIGNER_BUNDLE]
    );
    for leaf in [secret::APISERVER_CERT, secret::HYPERCONVERGED_WEBHOOK_CERT] {
        assert!(cert(&after, leaf).issued_by(&new), "{leaf}");
    }
    // The old CA leaves the bundle when it expires, and the plan looks again then at the latest.
    assert!(p.next <= old.not_after);
    let later = plan(&after, old.not_after + 1, &Durations::default(), NS).unwrap();
    let (_, text) = later
        .bundles
        .iter()
        .find(|(n, _)| n == secret::APISERVER_SIGNER_BUNDLE)
        .expect("the bundle is rewritten without the expired CA");
    assert_eq!(pki::parse_certs(text), vec![new]);
}

#[test]
fn a_certificate_whose_issuer_is_not_the_current_signer_is_reissued() {
    let mut now = made();
    let other = made();
    // The signer Secret was replaced (by hand, or a lost write): its certificates follow.
    now.secrets.insert(
        secret::UPLOAD_PROXY_SIGNER.into(),
        other.secrets[secret::UPLOAD_PROXY_SIGNER].clone(),
    );
    let p = plan(&now, T0 + HOUR, &Durations::default(), NS).unwrap();
    assert!(p.signers.is_empty());
    assert_eq!(written(&p.certs), vec![secret::UPLOAD_PROXY_CERT]);
}

#[test]
fn a_shortened_duration_renews_what_outlives_it() {
    let now = made();
    let short = Durations {
        server: Lifetime {
            duration: Duration::from_secs(2 * 3600),
            renew_before: Duration::from_secs(3600),
        },
        ..Durations::default()
    };
    let p = plan(&now, T0 + 60, &short, NS).unwrap();
    assert!(p.signers.is_empty());
    let after = apply(&now, &p);
    assert_eq!(
        cert(&after, secret::APISERVER_CERT).not_after,
        T0 + 60 + 2 * HOUR
    );
    assert_eq!(p.next, T0 + 60 + HOUR);
}

#[test]
fn a_certificate_never_outlives_its_signer_and_is_not_reissued_for_that_alone() {
    let d = Durations {
        server: Lifetime {
            duration: Duration::from_secs(100 * 3600),
            renew_before: Duration::from_secs(3600),
        },
        ..Durations::default()
    };
    let now = apply(
        &Current::default(),
        &plan(&Current::default(), T0, &d, NS).unwrap(),
    );
    let ca = cert(&now, secret::APISERVER_SIGNER);
    assert_eq!(cert(&now, secret::APISERVER_CERT).not_after, ca.not_after);
    // The certificate ends with its CA: it is renewed when the CA is (24h before their end),
    // not by its own renewBefore.
    let p = plan(&now, T0 + 20 * HOUR, &d, NS).unwrap();
    assert!(p.is_empty(), "{p:?}");
    assert_eq!(p.next, T0 + 24 * HOUR);
}

#[test]
fn damaged_secrets_and_bundles_are_made_anew() {
    let mut now = made();
    now.secrets
        .get_mut(secret::APISERVER_CERT)
        .unwrap()
        .insert(TLS_KEY.into(), "not a key".into());
    now.secrets
        .get_mut(secret::UPLOAD_TOKEN_KEY)
        .unwrap()
        .insert(PUBLIC_PEM.into(), "not the public key".into());
    now.bundles
        .insert(secret::UPLOAD_PROXY_SIGNER_BUNDLE.into(), "garbage".into());
    let p = plan(&now, T0 + HOUR, &Durations::default(), NS).unwrap();
    let mut certs = written(&p.certs);
    certs.sort();
    assert_eq!(certs, [secret::APISERVER_CERT, secret::UPLOAD_TOKEN_KEY]);
    assert_eq!(
        p.bundles,
        vec![(
            secret::UPLOAD_PROXY_SIGNER_BUNDLE.to_string(),
            made_bundle(&now, secret::UPLOAD_PROXY_SIGNER)
        )]
    );
}

fn made_bundle(current: &Current, signer: &str) -> String {
    pki::pem_of(&cert(current, signer).der)
}

#[test]
fn durations_come_from_cert_config_with_hco_defaults() {
    let rot = |d: Option<&str>, r: Option<&str>| {
        Some(CertRotation {
            duration: d.map(Into::into),
            renew_before: r.map(Into::into),
        })
    };
    assert_eq!(
        Durations::from_cert_config(&CertConfig::default()),
        Ok(Durations::default())
    );
    let d = Durations::from_cert_config(&CertConfig {
        ca: rot(Some("100h"), None),
        server: rot(Some("10m"), Some("5m0s")),
    })
    .unwrap();
    assert_eq!(d.ca.duration, Duration::from_secs(100 * 3600));
    assert_eq!(d.ca.renew_before, Duration::from_secs(24 * 3600));
    assert_eq!(d.server.renew_before, Duration::from_secs(300));
    // A renewBefore (here the 24h default) not shorter than the duration is refused.
    assert!(
        Durations::from_cert_config(&CertConfig {
            ca: rot(Some("1h30m"), None),
            server: None
        })
        .is_err()
    );
    assert!(
        Durations::from_cert_config(&CertConfig {
            ca: rot(Some("soon"), None),
            server: None
        })
        .is_err()
    );
}

#[test]
fn an_upload_server_secret_is_issued_once_and_again_when_due_or_its_signer_changes() {
    let now = made();
    let signer_of = |c: &Current| {
        let d = &c.secrets[secret::UPLOAD_SERVER_SIGNER];
        Pair {
            cert: d[TLS_CRT].clone(),
            key: d[TLS_KEY].clone(),
        }
    };
    let signer = signer_of(&now);
    let bundle = &now.bundles[secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE];
    let d = Durations::default();
    let svc = ("cdi-upload-disk", "vms");
    let first = upload_server_secret(None, &signer, bundle, svc, T0, &d).unwrap();
    let data = first.write.unwrap();
    // 24h certificate, renewed 12h before its end.
    assert_eq!(first.next, T0 + 12 * HOUR);
    let c = pki::parse_cert(&data[TLS_CRT]).unwrap();
    assert!(c.issued_by(&pki::parse_cert(&signer.cert).unwrap()));
    assert_eq!(c.dns_names[2], "cdi-upload-disk.vms.svc");
    assert_eq!(&data[CA_CRT], bundle);
    // Sound: nothing to write; due (12h before its end), a new signer, or a new bundle: anew.
    let again = |at, signer: &Pair, bundle: &str| {
        upload_server_secret(Some(&data), signer, bundle, svc, at, &d)
            .unwrap()
            .write
    };
    assert_eq!(again(T0 + HOUR, &signer, bundle), None);
    assert!(again(T0 + 12 * HOUR, &signer, bundle).is_some());
    assert!(again(T0 + HOUR, &signer_of(&made()), bundle).is_some());
    assert!(again(T0 + HOUR, &signer, "another bundle").is_some());
}

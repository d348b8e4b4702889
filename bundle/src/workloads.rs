//! The namespace and the components' Deployments and Services. Every pod template here meets
//! Pod Security `restricted` (non-root UID 107 as the image, no privilege escalation, no
//! capabilities, RuntimeDefault seccomp, a read-only root filesystem, resource requests); only
//! the CSI DaemonSet (`hostpath::objects`) needs the namespace's `privileged` level.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use serde_json::{Value, json};

use api::names::{NAMESPACE, component, secret, service};

use api::rbac::meta;

/// The image's non-root user (CDI's UID, which the image's files belong to).
pub const UID: i64 = 107;
/// Port of the controllers' metrics and `/healthz`.
const METRICS_PORT: u16 = 8080;
/// Port the HTTPS servers listen on in their pods (Services map 443 to it).
pub const HTTPS_PORT: u16 = 8443;

/// The namespace: `privileged`, which the CSI driver needs (host mounts, mount propagation).
pub fn namespace() -> Namespace {
    let mut ns = Namespace {
        metadata: meta(NAMESPACE, None, "quarry"),
        ..Default::default()
    };
    ns.metadata.labels.get_or_insert_default().insert(
        "pod-security.kubernetes.io/enforce".into(),
        "privileged".into(),
    );
    ns
}

/// A mounted Secret or ConfigMap (all its keys, or the `items` given).
struct Mount {
    volume: &'static str,
    path: &'static str,
    source: Value,
}

fn secret_mount(volume: &'static str, path: &'static str, name: &str, keys: &[&str]) -> Mount {
    let mut source = json!({"secret": {"secretName": name}});
    if !keys.is_empty() {
        source["secret"]["items"] = keys.iter().map(|k| json!({"key": k, "path": k})).collect();
    }
    Mount {
        volume,
        path,
        source,
    }
}

/// How a component's pod runs.
struct Workload {
    component: &'static str,
    args: Vec<String>,
    mounts: Vec<Mount>,
    /// The readiness check: (scheme, port, path).
    probe: (&'static str, u16, &'static str),
    /// Requests (CDI's figures for its counterparts).
    cpu: &'static str,
    memory: &'static str,
    /// Exposed ports beside metrics: (name, port).
    ports: Vec<(&'static str, u16)>,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The pod template of `w`.
fn pod_template(w: &Workload, image: &str) -> Value {
    // The controllers serve metrics (and their health check) on METRICS_PORT.
    let mut ports = Vec::new();
    if w.probe.1 == METRICS_PORT {
        ports.push(json!({"name": "metrics", "containerPort": METRICS_PORT}));
    }
    ports.extend(
        w.ports
            .iter()
            .map(|(n, p)| json!({"name": n, "containerPort": p})),
    );
    let (scheme, port, path) = w.probe;
    let probe = json!({"httpGet": {"scheme": scheme, "port": port, "path": path},
                       "periodSeconds": 10});
    json!({
        "metadata": {"labels": {"app.kubernetes.io/name": w.component}},
        "spec": {
            "serviceAccountName": w.component,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": UID, "runAsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "containers": [{
                "name": w.component,
                "image": image,
                "args": w.args,
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
                "ports": ports,
                "readinessProbe": probe,
                "livenessProbe": probe,
                "resources": {"requests": {"cpu": w.cpu, "memory": w.memory}},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true,
                    "runAsNonRoot": true,
                },
                "volumeMounts": w.mounts.iter()
                    .map(|m| json!({"name": m.volume, "mountPath": m.path, "readOnly": true}))
                    .collect::<Vec<_>>(),
            }],
            "volumes": w.mounts.iter().map(|m| {
                let mut v = m.source.clone();
                v["name"] = json!(m.volume);
                v
            }).collect::<Vec<_>>(),
        }
    })
}

fn deployment(w: &Workload, image: &str) -> Deployment {
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(w.component, Some(NAMESPACE), w.component),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": w.component}},
            "template": pod_template(w, image),
        }
    });
    serde_json::from_value(d).expect("a Deployment")
}

/// Service `name` on port 443 to the component's HTTPS port.
fn https_service(name: &str, component: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(name, Some(NAMESPACE), component),
        "spec": {
            "selector": {"app.kubernetes.io/name": component},
            "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}],
        }
    }))
    .expect("a Service")
}

const SERVING: &str = "/var/run/quarry/serving";
const TOKEN: &str = "/var/run/quarry/token";

fn workloads() -> Vec<(Workload, Option<&'static str>)> {
    let controller = |which: &str| s(&["controller", which, "--leader-elect"]);
    let health = ("HTTP", METRICS_PORT, "/healthz");
    let ns = format!("--namespace={NAMESPACE}");
    vec![
        (
            Workload {
                component: component::DATAVOLUME_CONTROLLER,
                // Upload servers get certificates from the cert controller's signer; clone
                // tokens are checked with the token key's public half.
                args: [
                    controller("datavolume"),
                    vec![
                        format!("--upload-tls-signer-namespace={NAMESPACE}"),
                        format!("--clone-token-public-key={TOKEN}/public.pem"),
                    ],
                ]
                .concat(),
                mounts: vec![secret_mount(
                    "token-key",
                    TOKEN,
                    secret::UPLOAD_TOKEN_KEY,
                    &["public.pem"],
                )],
                probe: health,
                cpu: "10m",
                memory: "150Mi",
                ports: vec![],
            },
            None,
        ),
        (
            Workload {
                component: component::HYPERCONVERGED_CONTROLLER,
                args: [
                    controller("hyperconverged"),
                    vec![
                        ns.clone(),
                        format!("--webhook-addr=0.0.0.0:{HTTPS_PORT}"),
                        format!("--webhook-tls-cert={SERVING}/tls.crt"),
                        format!("--webhook-tls-key={SERVING}/tls.key"),
                    ],
                ]
                .concat(),
                mounts: vec![secret_mount(
                    "webhook-cert",
                    SERVING,
                    secret::HYPERCONVERGED_WEBHOOK_CERT,
                    &[],
                )],
                probe: health,
                cpu: "10m",
                memory: "96Mi",
                ports: vec![("https", HTTPS_PORT)],
            },
            Some(service::HYPERCONVERGED_WEBHOOK),
        ),
        (
            Workload {
                component: component::HOSTPATH_CONTROLLER,
                args: [controller("hostpath"), vec![ns]].concat(),
                mounts: vec![],
                probe: health,
                cpu: "10m",
                memory: "96Mi",
                ports: vec![],
            },
            None,
        ),
        (
            Workload {
                component: component::CERT_CONTROLLER,
                args: controller("certs"),
                mounts: vec![],
                probe: health,
                cpu: "10m",
                memory: "64Mi",
                ports: vec![],
            },
            None,
        ),
        (
            Workload {
                component: component::UPLOAD_PROXY,
                args: vec![
                    "upload-proxy".into(),
                    format!("--listen=0.0.0.0:{HTTPS_PORT}"),
                    format!("--tls-cert={SERVING}/tls.crt"),
                    format!("--tls-key={SERVING}/tls.key"),
                    "--client-cert=/var/run/quarry/client/tls.crt".into(),
                    "--client-key=/var/run/quarry/client/tls.key".into(),
                    format!(
                        "--upstream-ca=/var/run/quarry/upstream-ca/{}",
                        secret::BUNDLE_KEY
                    ),
                    format!("--public-key={TOKEN}/public.pem"),
                ],
                mounts: vec![
                    secret_mount("serving-cert", SERVING, secret::UPLOAD_PROXY_CERT, &[]),
                    secret_mount(
                        "client-cert",
                        "/var/run/quarry/client",
                        secret::UPLOAD_PROXY_CLIENT_CERT,
                        &[],
                    ),
                    Mount {
                        volume: "upstream-ca",
                        path: "/var/run/quarry/upstream-ca",
                        source: json!({"configMap": {"name": secret::UPLOAD_SERVER_SIGNER_BUNDLE}}),
                    },
                    // Only the public half of the token key.
                    secret_mount(
                        "token-key",
                        TOKEN,
                        secret::UPLOAD_TOKEN_KEY,
                        &["public.pem"],
                    ),
                ],
                probe: ("HTTPS", HTTPS_PORT, "/healthz"),
                cpu: "10m",
                memory: "80Mi",
                ports: vec![("https", HTTPS_PORT)],
            },
            Some(service::UPLOAD_PROXY),
        ),
        (
            Workload {
                component: component::APISERVER,
                args: vec![
                    "apiserver".into(),
                    format!("--listen=0.0.0.0:{HTTPS_PORT}"),
                    format!("--tls-cert={SERVING}/tls.crt"),
                    format!("--tls-key={SERVING}/tls.key"),
                    format!("--signing-key={TOKEN}/tls.key"),
                ],
                mounts: vec![
                    secret_mount("serving-cert", SERVING, secret::APISERVER_CERT, &[]),
                    secret_mount("token-key", TOKEN, secret::UPLOAD_TOKEN_KEY, &["tls.key"]),
                ],
                probe: ("HTTPS", HTTPS_PORT, "/readyz"),
                cpu: "10m",
                memory: "60Mi",
                ports: vec![("https", HTTPS_PORT)],
            },
            Some(service::APISERVER),
        ),
    ]
}

/// Per component: its Deployment and, for servers, its Service.
pub fn deployments(image: &str) -> Vec<(&'static str, Deployment, Option<Service>)> {
    workloads()
        .into_iter()
        .map(|(w, svc)| {
            let service = svc.map(|name| https_service(name, w.component));
            (w.component, deployment(&w, image), service)
        })
        .collect()
}

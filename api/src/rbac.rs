//! Least-privilege RBAC per component, written once as [`Access`] and used twice: rendered into
//! the bundle's ServiceAccounts, (Cluster)Roles and bindings, and matched against the requests
//! the components really make ([`allows`]: the mock-transport tests check every request they
//! answer, see `mockapi`). A Role in the component's own namespace where that suffices; a
//! ClusterRole where the objects are cluster-scoped or in users' namespaces; `resourceNames`
//! wherever the object's name is fixed (never on `create`, `list` or `watch`, which RBAC cannot
//! restrict by name).

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::children;
use crate::names::csi::{CLUSTER_ROLE as CSI_ROLE, DRIVER_APP, POOLS_CONFIG_MAP};
use crate::names::{self, NAMESPACE, component};

/// An RBAC rule (no resourceNames).
pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(v(groups)),
        resources: Some(v(resources)),
        verbs: v(verbs),
        ..Default::default()
    }
}

/// Where a set of rules applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace and cluster-scoped objects (ClusterRole + ClusterRoleBinding).
    Cluster,
    /// The component's own namespace, [`NAMESPACE`] in the bundle (Role + RoleBinding).
    Home,
}

/// A role the cluster itself defines, bound to a component (aggregated API servers' pair).
#[derive(Debug, Clone)]
pub struct BuiltIn {
    /// `ClusterRole` or `Role`.
    pub kind: &'static str,
    pub name: &'static str,
    /// Where a Role lives (and so where the RoleBinding goes); None for a ClusterRole.
    pub namespace: Option<&'static str>,
    /// What it grants (as Kubernetes defines it), for [`allows`].
    pub rules: Vec<PolicyRule>,
}

/// What one component may do.
#[derive(Debug, Clone)]
pub struct Access {
    /// Component, ServiceAccount and role name.
    pub component: &'static str,
    pub grants: Vec<(Scope, Vec<PolicyRule>)>,
    pub built_in: Vec<BuiltIn>,
}

fn named(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(names.iter().map(|n| n.to_string()).collect()),
        ..rule(groups, resources, verbs)
    }
}

/// The Lease a controller elects its leader on.
fn leader_rules(component: &str) -> Vec<PolicyRule> {
    let lease = names::lease(component);
    vec![
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        named(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "update"],
            &[&lease],
        ),
    ]
}

/// A fixed-name object a controller server-side applies: created once, then got and patched.
fn applied(group: &str, resource: &str, name: &str, extra: &[&str]) -> Vec<PolicyRule> {
    let mut verbs = vec!["get", "patch"];
    verbs.extend_from_slice(extra);
    vec![
        rule(&[group], &[resource], &["create"]),
        named(&[group], &[resource], &verbs, &[name]),
    ]
}

/// Every component's access (the CSI driver's is `hostpath::objects`, rendered beside it).
pub fn all() -> Vec<Access> {
    vec![
        datavolume(),
        hyperconverged(),
        hostpath(),
        certs(),
        Access {
            // The proxy checks tokens with a mounted key and calls no API.
            component: component::UPLOAD_PROXY,
            grants: vec![],
            built_in: vec![],
        },
        apiserver(),
    ]
}

fn datavolume() -> Access {
    const CDI: &str = "cdi.kubevirt.io";
    let cluster = vec![
        // DataImportCrons create their import DataVolumes and delete old ones.
        rule(
            &[CDI],
            &["datavolumes"],
            &[
                "get", "list", "watch", "create", "delete", "patch", "update",
            ],
        ),
        rule(&[CDI], &["datavolumes/status"], &["patch", "update"]),
        // Pods and PVCs name their DataVolume as owner with blockOwnerDeletion.
        rule(&[CDI], &["datavolumes/finalizers"], &["update"]),
        rule(
            &[""],
            &["persistentvolumeclaims", "pods", "services"],
            &["get", "list", "watch", "create", "delete"],
        ),
        // A clone's target grows to the requested size after a CSI clone or restore; a
        // DataImportCron stamps its last import's PVC (labels, last use time).
        rule(&[""], &["persistentvolumeclaims"], &["patch"]),
        // The source's CA ConfigMap and header Secrets; per-upload-pod certificates (issued
        // from the upload server signer in its own namespace); the import proxy's CA, copied
        // next to the importer pod.
        rule(&[""], &["configmaps"], &["get", "create", "delete"]),
        rule(&[""], &["secrets"], &["get", "create", "patch", "delete"]),
        rule(&[""], &["events"], &["create"]),
        rule(
            &["storage.k8s.io"],
            &["storageclasses"],
            &["get", "list", "watch"],
        ),
        // Its settings come from the CDI CR; it keeps CDIConfig and the StorageProfiles.
        rule(&[CDI], &["cdis"], &["get", "list", "watch"]),
        // The active CDI CR's status: Available once Quarry's CDI Deployments are.
        rule(&[CDI], &["cdis/status"], &["patch", "update"]),
        rule(
            &[CDI],
            &["cdiconfigs"],
            &["get", "list", "watch", "create", "update", "patch"],
        ),
        rule(&[CDI], &["cdiconfigs/status"], &["patch", "update"]),
        rule(
            &[CDI],
            &["storageprofiles"],
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
        rule(&[CDI], &["storageprofiles/status"], &["patch", "update"]),
        // DataSources: Ready follows their source; a DataVolume's sourceRef reads them; a
        // DataImportCron creates its managed one, points it at the newest import, and deletes it
        // with the cron under retentionPolicy None.
        rule(
            &[CDI],
            &["datasources"],
            &["get", "list", "watch", "create", "update", "delete"],
        ),
        rule(&[CDI], &["datasources/status"], &["patch", "update"]),
        // Smart clones: a temporary snapshot of the source, of the class of its driver.
        // DataImportCrons of the snapshot format keep each version as a snapshot: taken,
        // stamped as used (labels, last use time), listed by their label for garbage
        // collection and deleted beyond importsToKeep. Awaited by polling, not watched.
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshots"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshotclasses"],
            &["list"],
        ),
        // DataImportCrons: annotations (the polled digest, the next run) and the finalizer;
        // their DataSources name them as owner with blockOwnerDeletion.
        rule(
            &[CDI],
            &["dataimportcrons"],
            &["get", "list", "watch", "patch", "update"],
        ),
        rule(&[CDI], &["dataimportcrons/status"], &["patch", "update"]),
        rule(&[CDI], &["dataimportcrons/finalizers"], &["update"]),
        // Volume populators: the sources PVCs name, the volume of a filled PVC' rebound to its
        // target, and their registration for the volume data source validator.
        rule(
            &[CDI],
            &[
                "volumeimportsources",
                "volumeuploadsources",
                "volumeclonesources",
            ],
            &["get", "list", "watch", "create"],
        ),
        // A DataVolume uses the populators where its StorageClass is a CSI driver's.
        rule(&["storage.k8s.io"], &["csidrivers"], &["get"]),
        // A PVC' bound at once with no consumer goes to a node the driver runs on.
        rule(&[""], &["nodes"], &["list"]),
        rule(&["storage.k8s.io"], &["csinodes"], &["list"]),
        // (get: also a DataImportCron's, for the node an import's volume is pinned to.)
        rule(&[""], &["persistentvolumes"], &["get", "patch"]),
        rule(
            &["populator.storage.k8s.io"],
            &["volumepopulators"],
            &["get", "create", "patch"],
        ),
    ];
    let mut home = leader_rules(component::DATAVOLUME_CONTROLLER);
    // The CDI CR's status follows the CDI components' Deployments.
    home.push(rule(&["apps"], &["deployments"], &["get", "list", "watch"]));
    // CDIConfig's uploadProxyURL: an Ingress routing to the upload proxy.
    home.push(rule(
        &["networking.k8s.io"],
        &["ingresses"],
        &["get", "list", "watch"],
    ));
    Access {
        component: component::DATAVOLUME_CONTROLLER,
        grants: vec![(Scope::Cluster, cluster), (Scope::Home, home)],
        built_in: vec![],
    }
}

fn hyperconverged() -> Access {
    const HCO: &str = "hco.kubevirt.io";
    let mut home = vec![
        rule(&[HCO], &["hyperconvergeds"], &["get", "list", "watch"]),
        rule(&[HCO], &["hyperconvergeds/status"], &["patch", "update"]),
        rule(&[HCO], &["hyperconvergeds/finalizers"], &["update"]),
        rule(&[""], &["events"], &["create"]),
    ];
    // The webhook refuses an uninstall while DataVolumes exist anywhere.
    let mut cluster = vec![
        rule(&["cdi.kubevirt.io"], &["datavolumes"], &["list"]),
        // Golden images: DataImportCrons in the boot image namespace (any namespace the CR
        // names), made when missing.
        rule(
            &["cdi.kubevirt.io"],
            &["dataimportcrons"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(&[""], &["namespaces"], &["get", "create"]),
    ];
    for kind in children::ALL {
        let to = if kind.namespaced {
            &mut home
        } else {
            &mut cluster
        };
        to.push(rule(&[kind.group], &[kind.plural], &["list", "watch"]));
        let extra: &[&str] = if kind == children::HOSTPATH {
            // Removed when the HyperConverged no longer asks for it.
            &["delete"]
        } else {
            &[]
        };
        to.extend(applied(kind.group, kind.plural, kind.name, extra));
    }
    home.extend(leader_rules(component::HYPERCONVERGED_CONTROLLER));
    Access {
        component: component::HYPERCONVERGED_CONTROLLER,
        grants: vec![(Scope::Cluster, cluster), (Scope::Home, home)],
        built_in: vec![],
    }
}

fn hostpath() -> Access {
    const HPP: &str = "hostpathprovisioner.kubevirt.io";
    const RBAC: &str = "rbac.authorization.k8s.io";
    let mut cluster = vec![
        // `create`: the default one, when there is none (`--default-pool`)
        rule(
            &[HPP],
            &["hostpathprovisioners"],
            &["get", "list", "watch", "create"],
        ),
        rule(
            &[HPP],
            &["hostpathprovisioners/status"],
            &["patch", "update"],
        ),
        rule(&[HPP], &["hostpathprovisioners/finalizers"], &["update"]),
        // One StorageClass per pool: names follow the CR.
        rule(
            &["storage.k8s.io"],
            &["storageclasses"],
            &["get", "list", "watch", "create", "patch"],
        ),
    ];
    // Writing the CSI driver's ClusterRole and binding without holding its rules: `escalate`
    // and `bind` on that one role.
    cluster.extend(applied(
        RBAC,
        "clusterroles",
        CSI_ROLE,
        &["escalate", "bind"],
    ));
    cluster.extend(applied(RBAC, "clusterrolebindings", CSI_ROLE, &[]));
    cluster.extend(applied(
        "storage.k8s.io",
        "csidrivers",
        provisioner::DRIVER_NAME,
        &[],
    ));
    let mut home = vec![
        rule(&["apps"], &["daemonsets"], &["list", "watch"]),
        // Its own pod, for the image the driver runs; the driver's pods, for the nodes a
        // pvcTemplate pool is mounted on.
        rule(&[""], &["pods"], &["get", "list"]),
        // pvcTemplate pools: a PVC and a mounter Deployment per node (mounters of pools or
        // nodes gone are deleted; the PVCs, holding volumes, never).
        rule(&[""], &["persistentvolumeclaims"], &["get", "create"]),
        rule(
            &["apps"],
            &["deployments"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
    ];
    home.extend(applied("apps", "daemonsets", DRIVER_APP, &[]));
    home.extend(applied("", "serviceaccounts", DRIVER_APP, &[]));
    home.extend(applied("", "configmaps", POOLS_CONFIG_MAP, &[]));
    home.extend(leader_rules(component::HOSTPATH_CONTROLLER));
    Access {
        component: component::HOSTPATH_CONTROLLER,
        grants: vec![(Scope::Cluster, cluster), (Scope::Home, home)],
        built_in: vec![],
    }
}

fn certs() -> Access {
    let mut home = vec![rule(
        &[""],
        &["secrets", "configmaps"],
        &["get", "list", "watch", "create", "update", "patch"],
    )];
    home.extend(leader_rules(component::CERT_CONTROLLER));
    let webhooks = [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ];
    let cluster = vec![
        rule(
            &["apiregistration.k8s.io"],
            &["apiservices"],
            &["list", "watch"],
        ),
        named(
            &["apiregistration.k8s.io"],
            &["apiservices"],
            &["get", "patch", "update"],
            &names::API_SERVICES,
        ),
        rule(
            &["admissionregistration.k8s.io"],
            &["validatingwebhookconfigurations"],
            &["list", "watch"],
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["validatingwebhookconfigurations"],
            &["get", "patch", "update"],
            &webhooks,
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            &["get", "patch", "update"],
            &[names::webhook::DATAVOLUME_MUTATE_CONFIG],
        ),
        // HyperConverged's certConfig reaches it through the CDI CR.
        rule(&["cdi.kubevirt.io"], &["cdis"], &["get", "list", "watch"]),
    ];
    Access {
        component: component::CERT_CONTROLLER,
        grants: vec![(Scope::Cluster, cluster), (Scope::Home, home)],
        built_in: vec![],
    }
}

fn apiserver() -> Access {
    Access {
        component: component::APISERVER,
        grants: vec![(
            Scope::Cluster,
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
                rule(&[""], &["persistentvolumeclaims"], &["get"]),
                // A clone's sourceRef: its DataSource names the source to authorize.
                rule(&["cdi.kubevirt.io"], &["datasources"], &["get"]),
            ],
        )],
        // What every aggregated API server is given (CDI's cdi-apiserver too).
        built_in: vec![
            BuiltIn {
                kind: "ClusterRole",
                name: "system:auth-delegator",
                namespace: None,
                rules: vec![
                    rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                    rule(
                        &["authorization.k8s.io"],
                        &["subjectaccessreviews"],
                        &["create"],
                    ),
                ],
            },
            BuiltIn {
                kind: "Role",
                name: "extension-apiserver-authentication-reader",
                namespace: Some("kube-system"),
                rules: vec![named(
                    &[""],
                    &["configmaps"],
                    &["get", "list", "watch"],
                    &["extension-apiserver-authentication"],
                )],
            },
        ],
    }
}

/// The access of `component`, if it is one of [`all`].
pub fn of(component: &str) -> Option<Access> {
    all().into_iter().find(|a| a.component == component)
}

/// One API request as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub verb: String,
    pub group: String,
    /// With its subresource: `pods/status`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if let Some(n) = &self.name {
            write!(f, " {n:?}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " (cluster-wide)"),
        }
    }
}

/// The RBAC request of an HTTP request to the API server (None for non-resource paths).
pub fn request(method: &Method, path: &str, query: &str) -> Option<Request> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(name.to_string()), None),
        [resource, name, sub] => (*resource, Some(name.to_string()), Some(*sub)),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method.as_str(), name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(Request {
        verb: verb.into(),
        group: group.into(),
        resource: match sub {
            Some(s) => format!("{resource}/{s}"),
            None => resource.into(),
        },
        namespace,
        name,
    })
}

fn has(list: Option<&Vec<String>>, value: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|v| v == "*" || v == value))
}

/// Whether `rule` grants `req` (RBAC's own matching: verb, group, resource with subresource,
/// and resourceNames, which a request without a name never matches).
pub fn rule_allows(rule: &PolicyRule, req: &Request) -> bool {
    let names_ok = match rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
        None => true,
        Some(names) => req.name.as_ref().is_some_and(|n| names.contains(n)),
    };
    rule.verbs.iter().any(|v| v == "*" || *v == req.verb)
        && has(rule.api_groups.as_ref(), &req.group)
        && has(rule.resources.as_ref(), &req.resource)
        && names_ok
}

/// Whether `access` grants `req`, with the component in namespace `home` (None: the mock
/// tests, which pick their own namespaces, so any namespace counts as home).
pub fn allows(access: &Access, req: &Request, home: Option<&str>) -> bool {
    let in_home = match (home, &req.namespace) {
        (None, Some(_)) => true,
        (Some(h), Some(ns)) => h == ns,
        (_, None) => false,
    };
    let granted = access.grants.iter().any(|(scope, rules)| {
        (*scope == Scope::Cluster || in_home) && rules.iter().any(|r| rule_allows(r, req))
    });
    granted
        || access.built_in.iter().any(|b| {
            (b.namespace.is_none() || b.namespace == req.namespace.as_deref())
                && b.rules.iter().any(|r| rule_allows(r, req))
        })
}

fn labels(component: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), component.to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "quarry".to_string(),
        ),
    ]))
}

/// Metadata of a component's object.
pub fn meta(name: &str, namespace: Option<&str>, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: labels(component),
        ..Default::default()
    }
}

fn subject(component: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: component.into(),
        namespace: Some(NAMESPACE.into()),
        ..Default::default()
    }]
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

/// The ServiceAccount, roles and bindings of `access`, as JSON documents in apply order.
pub fn objects(access: &Access) -> Vec<serde_json::Value> {
    let c = access.component;
    let to_json = |v: serde_json::Result<serde_json::Value>| v.expect("RBAC objects serialise");
    let mut out = vec![to_json(serde_json::to_value(ServiceAccount {
        metadata: meta(c, Some(NAMESPACE), c),
        // Only what calls the API gets a token.
        automount_service_account_token: (access.grants.is_empty() && access.built_in.is_empty())
            .then_some(false),
        ..Default::default()
    }))];
    for (scope, rules) in &access.grants {
        match scope {
            Scope::Cluster => {
                out.push(to_json(serde_json::to_value(ClusterRole {
                    metadata: meta(c, None, c),
                    rules: Some(rules.clone()),
                    ..Default::default()
                })));
                out.push(to_json(serde_json::to_value(ClusterRoleBinding {
                    metadata: meta(c, None, c),
                    role_ref: role_ref("ClusterRole", c),
                    subjects: Some(subject(c)),
                })));
            }
            Scope::Home => {
                out.push(to_json(serde_json::to_value(Role {
                    metadata: meta(c, Some(NAMESPACE), c),
                    rules: Some(rules.clone()),
                })));
                out.push(to_json(serde_json::to_value(RoleBinding {
                    metadata: meta(c, Some(NAMESPACE), c),
                    role_ref: role_ref("Role", c),
                    subjects: Some(subject(c)),
                })));
            }
        }
    }
    for b in &access.built_in {
        let name = format!("{c}:{}", b.name.trim_start_matches("system:"));
        out.push(match b.namespace {
            None => to_json(serde_json::to_value(ClusterRoleBinding {
                metadata: meta(&name, None, c),
                role_ref: role_ref(b.kind, b.name),
                subjects: Some(subject(c)),
            })),
            Some(ns) => to_json(serde_json::to_value(RoleBinding {
                metadata: meta(&name, Some(ns), c),
                role_ref: role_ref(b.kind, b.name),
                subjects: Some(subject(c)),
            })),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, query: &str) -> Request {
        request(&method, path, query).unwrap()
    }

    #[test]
    fn requests_are_read_as_rbac_does() {
        let r = req(Method::GET, "/api/v1/namespaces/ns/pods", "watch=true&x=1");
        assert_eq!((r.verb.as_str(), r.group.as_str()), ("watch", ""));
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        let r = req(
            Method::PATCH,
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/ns/datavolumes/d/status",
            "",
        );
        assert_eq!(r.resource, "datavolumes/status");
        assert_eq!(r.name.as_deref(), Some("d"));
        assert_eq!(r.verb, "patch");
        let r = req(Method::GET, "/api/v1/namespaces/quarry", "");
        assert_eq!((r.resource.as_str(), r.namespace), ("namespaces", None));
        assert_eq!(
            req(Method::DELETE, "/api/v1/namespaces/n/pods", "").verb,
            "deletecollection"
        );
        assert!(request(&Method::GET, "/healthz", "").is_none());
    }

    #[test]
    fn resource_names_scopes_and_built_ins_are_matched() {
        let hpp = of(component::HOSTPATH_CONTROLLER).unwrap();
        let patch_role = |name: &str| {
            req(
                Method::PATCH,
                &format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"),
                "",
            )
        };
        assert!(allows(&hpp, &patch_role(CSI_ROLE), Some(NAMESPACE)));
        assert!(!allows(&hpp, &patch_role("cluster-admin"), Some(NAMESPACE)));
        // The DaemonSet only in the home namespace.
        let ds = |ns: &str| {
            req(
                Method::PATCH,
                &format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{DRIVER_APP}"),
                "",
            )
        };
        assert!(allows(&hpp, &ds(NAMESPACE), Some(NAMESPACE)));
        assert!(!allows(&hpp, &ds("default"), Some(NAMESPACE)));
        assert!(allows(&hpp, &ds("default"), None));
        // A create has no name: a named rule never grants it.
        let create = req(
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/quarry/leases",
            "",
        );
        assert!(!rule_allows(
            &named(&["coordination.k8s.io"], &["leases"], &["create"], &["x"]),
            &create
        ));
        assert!(allows(&hpp, &create, Some(NAMESPACE)));
        // Built-in roles bound to the token API.
        let api = of(component::APISERVER).unwrap();
        let cm = |ns: &str, name: &str| {
            req(
                Method::GET,
                &format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
                "",
            )
        };
        assert!(allows(
            &api,
            &cm("kube-system", "extension-apiserver-authentication"),
            None
        ));
        assert!(!allows(&api, &cm("kube-system", "other"), None));
        assert!(!allows(
            &api,
            &cm("quarry", "extension-apiserver-authentication"),
            None
        ));
        // The proxy may do nothing.
        let proxy = of(component::UPLOAD_PROXY).unwrap();
        assert!(!allows(&proxy, &cm("quarry", "x"), None));
    }
}

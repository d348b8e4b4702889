//! The kinds of object HCO keeps for a HyperConverged, with the upstream groups and names:
//! what the HyperConverged controller applies and what its RBAC grants.

use kube::api::{ApiResource, GroupVersionKind};

/// One kind of child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildKind {
    /// API group.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// The object's name.
    pub name: &'static str,
    /// Namespaced (in the HyperConverged's namespace) or cluster-scoped.
    pub namespaced: bool,
}

impl ChildKind {
    /// The API resource, for dynamic clients.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }
}

/// `CDI/cdi-kubevirt-hyperconverged`.
pub const CDI: ChildKind = ChildKind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "CDI",
    plural: "cdis",
    name: "cdi-kubevirt-hyperconverged",
    namespaced: false,
};
/// `KubeVirt/kubevirt-kubevirt-hyperconverged`.
pub const KUBEVIRT: ChildKind = ChildKind {
    group: "kubevirt.io",
    version: "v1",
    kind: "KubeVirt",
    plural: "kubevirts",
    name: "kubevirt-kubevirt-hyperconverged",
    namespaced: true,
};
/// `SSP/ssp-kubevirt-hyperconverged`.
pub const SSP: ChildKind = ChildKind {
    group: "ssp.kubevirt.io",
    version: "v1beta2",
    kind: "SSP",
    plural: "ssps",
    name: "ssp-kubevirt-hyperconverged",
    namespaced: true,
};
/// `NetworkAddonsConfig/cluster`.
pub const NETWORK_ADDONS: ChildKind = ChildKind {
    group: "networkaddonsoperator.network.kubevirt.io",
    version: "v1",
    kind: "NetworkAddonsConfig",
    plural: "networkaddonsconfigs",
    name: "cluster",
    namespaced: false,
};
/// `HostPathProvisioner/hostpath-provisioner`.
pub const HOSTPATH: ChildKind = ChildKind {
    group: "hostpathprovisioner.kubevirt.io",
    version: "v1beta1",
    kind: "HostPathProvisioner",
    plural: "hostpathprovisioners",
    name: "hostpath-provisioner",
    namespaced: false,
};

/// Every kind a HyperConverged may have.
pub const ALL: [ChildKind; 5] = [CDI, KUBEVIRT, SSP, NETWORK_ADDONS, HOSTPATH];

//! The names a cluster install agrees on: the deploy bundle (`deploy`), the cert controller, the
//! controllers and the servers refer to one another's objects by these, so each is written once.
//! Every object lives in [`NAMESPACE`] unless it is cluster-scoped.

/// The image every component runs (`gen-deploy --image`, or kustomize `images:`).
pub const DEFAULT_IMAGE: &str = "quay.io/quarry/quarry:latest";

/// The API group of CDI's upload token API, served by `quarry apiserver`.
pub const UPLOAD_API_GROUP: &str = "upload.cdi.kubevirt.io";

/// The namespace of every Quarry component.
pub const NAMESPACE: &str = "quarry";

/// The components: each is one Deployment, and one ServiceAccount of the same name.
pub mod component {
    pub const DATAVOLUME_CONTROLLER: &str = "quarry-datavolume-controller";
    pub const HYPERCONVERGED_CONTROLLER: &str = "quarry-hyperconverged-controller";
    pub const HOSTPATH_CONTROLLER: &str = "quarry-hostpath-controller";
    pub const CERT_CONTROLLER: &str = "quarry-cert-controller";
    pub const UPLOAD_PROXY: &str = "quarry-uploadproxy";
    pub const APISERVER: &str = "quarry-apiserver";
    /// `quarry controller datasource` run on its own (the bundle runs DataSources inside the
    /// DataVolume controller's process, under its ServiceAccount); its Lease name.
    pub const DATASOURCE_CONTROLLER: &str = "quarry-datasource-controller";
}

/// The CSI driver's objects, which the HostPathProvisioner controller makes.
pub mod csi {
    /// Name of the DaemonSet and ServiceAccount.
    pub const DRIVER_APP: &str = "quarry-csi";
    /// Name of the pool ConfigMap.
    pub const POOLS_CONFIG_MAP: &str = "quarry-csi-pools";
    /// Name of the ClusterRole and its binding.
    pub const CLUSTER_ROLE: &str = "quarry-csi-provisioner";
}

/// Services, in [`NAMESPACE`]; each serves HTTPS on port 443.
pub mod service {
    pub const UPLOAD_PROXY: &str = "quarry-uploadproxy";
    /// The token API (`upload.cdi.kubevirt.io`) and the DataVolume validating webhook.
    pub const APISERVER: &str = "quarry-apiserver";
    pub const HYPERCONVERGED_WEBHOOK: &str = "quarry-hyperconverged-webhook";
}

/// The `APIService`s of the token API (CDI serves both versions).
pub const API_SERVICES: [&str; 2] = [
    "v1beta1.upload.cdi.kubevirt.io",
    "v1alpha1.upload.cdi.kubevirt.io",
];

/// `ValidatingWebhookConfiguration`s, and the paths their servers answer on.
pub mod webhook {
    /// Served by the HyperConverged controller at [`HYPERCONVERGED_PATH`] (HCO's path).
    pub const HYPERCONVERGED_CONFIG: &str = "quarry-hyperconverged-validator";
    pub const HYPERCONVERGED_PATH: &str = "/validate-hco-kubevirt-io-v1beta1-hyperconverged";
    /// Served by `quarry apiserver` at [`DATAVOLUME_PATH`] (CDI's cdi-apiserver serves it too).
    pub const DATAVOLUME_CONFIG: &str = "quarry-datavolume-validator";
    pub const DATAVOLUME_PATH: &str = "/datavolume-validate";
    /// The `MutatingWebhookConfiguration` of CDI's DataVolume mutating webhook (clone
    /// authorization and the clone token), served by `quarry apiserver` at
    /// [`DATAVOLUME_MUTATE_PATH`].
    pub const DATAVOLUME_MUTATE_CONFIG: &str = "quarry-datavolume-mutator";
    pub const DATAVOLUME_MUTATE_PATH: &str = "/datavolume-mutate";
}

/// TLS material made and rotated by the cert controller. Signers and certificates are Secrets of
/// type `kubernetes.io/tls` (`tls.crt`, `tls.key`); bundles are ConfigMaps with the CA
/// certificates a client trusts under [`secret::BUNDLE_KEY`].
pub mod secret {
    /// Signs the token API's and both webhooks' serving certificates; its bundle goes into the
    /// APIServices' and webhook configurations' `caBundle`.
    pub const APISERVER_SIGNER: &str = "quarry-apiserver-signer";
    pub const APISERVER_SIGNER_BUNDLE: &str = "quarry-apiserver-signer-bundle";
    pub const APISERVER_CERT: &str = "quarry-apiserver-server-cert";
    pub const HYPERCONVERGED_WEBHOOK_CERT: &str = "quarry-hyperconverged-webhook-cert";
    /// The upload proxy's serving certificate (what `virtctl` connects to).
    pub const UPLOAD_PROXY_SIGNER: &str = "quarry-uploadproxy-signer";
    pub const UPLOAD_PROXY_SIGNER_BUNDLE: &str = "quarry-uploadproxy-signer-bundle";
    pub const UPLOAD_PROXY_CERT: &str = "quarry-uploadproxy-server-cert";
    /// Signs the upload servers' serving certificates (the proxy trusts its bundle).
    pub const UPLOAD_SERVER_SIGNER: &str = "quarry-uploadserver-signer";
    pub const UPLOAD_SERVER_SIGNER_BUNDLE: &str = "quarry-uploadserver-signer-bundle";
    /// Signs the proxy's client certificate (the upload servers trust its bundle).
    pub const UPLOAD_SERVER_CLIENT_SIGNER: &str = "quarry-uploadserver-client-signer";
    pub const UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE: &str = "quarry-uploadserver-client-signer-bundle";
    pub const UPLOAD_PROXY_CLIENT_CERT: &str = "quarry-uploadproxy-client-cert";
    /// The PS256 key pair of upload tokens: the token API signs with `tls.key`, the proxy checks
    /// with the public key (`public.pem` in the same Secret).
    pub const UPLOAD_TOKEN_KEY: &str = "quarry-upload-token-key";
    /// The key of a bundle ConfigMap (CDI's name).
    pub const BUNDLE_KEY: &str = "ca-bundle.crt";
}

/// Leader-election Leases (`coordination.k8s.io`), one per controller, in [`NAMESPACE`].
pub fn lease(component: &str) -> String {
    format!("{component}-leader")
}

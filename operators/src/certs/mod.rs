//! `quarry controller certs`: the TLS of a cluster install, made and rotated as CDI's cert
//! manager does. In its namespace it keeps the signers (self-signed CAs), the serving and client
//! certificates they sign and the bundle ConfigMaps clients trust (`names::secret`), plus the
//! upload token key pair; it puts the API server signer's bundle into the `caBundle` of the
//! token API's APIServices and of both validating webhook configurations, and looks again when
//! the next certificate is due. Lifetimes come from the `CDI` CR's `spec.certConfig` (which the
//! HyperConverged controller fills from its own). The decisions are [`plan::plan`]'s; this
//! module reads and writes the objects.

pub mod pki;
pub mod plan;

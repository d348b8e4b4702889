//! CDI's configuration objects, kept by the DataVolume controller's process as CDI's
//! cdi-deployment keeps them: the settings in force ([`crate::settings`]) taken from the active CDI
//! CR with explicit flags over it and published as the CDIConfig `config`, and one StorageProfile
//! per StorageClass ([`profile`]); the active CDI CR's status says whether Quarry's CDI
//! components are available ([`cdi_status`]). [`controller`] runs both reconcilers on the DataVolume
//! controller's client and hands the settings to its reconciles.

pub mod cdi_status;
pub mod controller;
pub mod profile;

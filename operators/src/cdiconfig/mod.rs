//! CDI's configuration objects, kept by the DataVolume controller's process as CDI's
//! cdi-deployment keeps them: the settings in force ([`settings`]) taken from the active CDI
//! CR with explicit flags over it and published as the CDIConfig `config`, and one StorageProfile
//! per StorageClass ([`profile`]). [`controller`] runs both reconcilers on the DataVolume
//! controller's client and hands the settings to its reconciles.

pub mod controller;
pub mod profile;
pub mod settings;

pub use settings::Overrides;

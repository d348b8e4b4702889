//! CDI's controllers, as CDI's cdi-deployment and cdi-apiserver run them: DataVolumes
//! ([`datavolume`]), the settings in force ([`settings`]) and CDI's configuration objects
//! ([`cdiconfig`]), golden images ([`golden`]: DataSources and DataImportCrons), the watches they share
//! ([`informers`]), the upload token
//! API and DataVolume webhooks ([`apiserver`]), and local mode ([`local`]: `quarry apply` without
//! a cluster).

pub mod apiserver;
pub mod cdiconfig;
pub mod datavolume;
pub mod golden;
pub mod informers;
pub mod local;
pub mod populator;
pub mod settings;

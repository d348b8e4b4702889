//! Golden images: the decisions behind DataSources and DataImportCrons, as CDI makes them: the
//! cron schedule ([`schedule`]), the source's version and the import's name ([`version`]), how a
//! source is polled ([`poll`]), the cron's status and imports ([`cron`]), whether imports are
//! kept as PVCs or VolumeSnapshots ([`snapshot`]), which old imports go ([`gc`]) and a
//! DataSource's Ready condition ([`datasource`]). The DataSource [`controller`]
//! and the DataImportCron [`cron_controller`] run them in the cluster; `crate::local::cron` runs
//! one cron cycle in local mode.

pub mod controller;
pub mod cron;
pub mod cron_controller;
pub mod datasource;
pub mod gc;
pub mod poll;
pub mod schedule;
pub mod snapshot;
pub mod version;

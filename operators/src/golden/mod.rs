//! Golden images: the decisions behind DataSources and DataImportCrons, as CDI makes them: the
//! cron schedule ([`schedule`]), the source's version and the import's name ([`version`]), which
//! old imports go ([`gc`]) and a DataSource's Ready condition ([`datasource`]), which the
//! DataSource [`controller`] keeps. No DataImportCron controller runs yet.

pub mod controller;
pub mod datasource;
pub mod gc;
pub mod local_store;
pub mod schedule;
pub mod version;

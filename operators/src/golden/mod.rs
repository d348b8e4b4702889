//! Golden images: the pure decisions behind DataSources and DataImportCrons, as CDI makes them
//! (no controller runs them yet): the cron schedule ([`schedule`]), the source's version and
//! the import's name ([`version`]), which old imports go ([`gc`]) and a DataSource's Ready
//! condition ([`datasource`]).

pub mod datasource;
pub mod gc;
pub mod schedule;
pub mod version;

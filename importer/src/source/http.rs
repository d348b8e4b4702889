//! HTTP(S) source: placeholder until the resuming source lands.

use std::io::{self, Read};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::source::{ByteSource, SourceInfo};

#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub ca_certs: Vec<PathBuf>,
    pub insecure: bool,
    pub headers: Vec<(String, String)>,
    pub basic_auth: Option<(String, String)>,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_retries: u32,
    pub retry_backoff: Duration,
    pub chunk_depth: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            ca_certs: Vec::new(),
            insecure: false,
            headers: Vec::new(),
            basic_auth: None,
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_retries: 5,
            retry_backoff: Duration::from_secs(1),
            chunk_depth: 8,
        }
    }
}

pub struct HttpSource {
    info: SourceInfo,
}

impl HttpSource {
    pub fn open(_url: &str, _opts: &HttpOptions) -> Result<Self> {
        Err(Error::Unsupported("HTTP source not built yet".into()))
    }
}

impl Read for HttpSource {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        Ok(0)
    }
}

impl ByteSource for HttpSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }
}

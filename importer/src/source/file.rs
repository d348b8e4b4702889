//! Local sources: a file path, or standard input (`-`).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::error::{Error, Result};
use crate::source::{ByteSource, SourceInfo};

pub struct FileSource {
    input: Box<dyn Read + Send>,
    info: SourceInfo,
}

impl FileSource {
    pub fn open(path: &Path) -> Result<Self> {
        let (file, info) = open_file(path)?;
        Ok(FileSource {
            input: Box::new(file),
            info,
        })
    }

    pub fn stdin() -> Self {
        FileSource {
            input: Box::new(io::stdin()),
            info: SourceInfo {
                name: "standard input".into(),
                length: None,
            },
        }
    }
}

impl Read for FileSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl ByteSource for FileSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }
}

/// Opens a local source file with clear errors for the usual mistakes; the length is known only
/// for regular files (not pipes or devices).
pub fn open_file(path: &Path) -> Result<(File, SourceInfo)> {
    let file = File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            Error::InvalidInput(format!("source {} does not exist", path.display()))
        }
        io::ErrorKind::PermissionDenied => {
            Error::InvalidInput(format!("source {} is not readable", path.display()))
        }
        _ => Error::io(format!("opening {}", path.display()), e),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("inspecting {}", path.display()), e))?;
    if meta.is_dir() {
        return Err(Error::InvalidInput(format!(
            "source {} is a directory",
            path.display()
        )));
    }
    let info = SourceInfo {
        name: path.display().to_string(),
        length: meta.is_file().then_some(meta.len()),
    };
    Ok((file, info))
}

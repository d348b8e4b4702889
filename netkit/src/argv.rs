//! Writing a command line that clap parses back: how a controller passes a typed argument struct
//! to the pod it starts (`quarry import`, `upload-server`, `clone-source`, `resize-disk`), each
//! with a `to_args` whose round trip a test checks.

use std::path::Path;

/// Arguments being written.
#[derive(Debug, Default)]
pub struct Argv(Vec<String>);

impl Argv {
    pub fn new() -> Self {
        Argv::default()
    }

    /// A positional argument.
    pub fn positional(&mut self, value: impl Into<String>) {
        self.0.push(value.into());
    }

    /// `--name VALUE` when there is a value; `--name=VALUE` when it could pass for an option,
    /// or holds a `$(VAR)` the kubelet expands (a Secret's value may start with `-`).
    pub fn opt(&mut self, name: &str, value: Option<impl std::fmt::Display>) {
        let Some(value) = value.map(|v| v.to_string()) else {
            return;
        };
        if value.starts_with('-') || value.contains("$(") {
            self.0.push(format!("--{name}={value}"));
        } else {
            self.0.extend([format!("--{name}"), value]);
        }
    }

    /// `--name PATH` for each path (paths that are not UTF-8 are written lossily).
    pub fn paths<'a, P: AsRef<Path> + 'a>(
        &mut self,
        name: &str,
        paths: impl IntoIterator<Item = &'a P>,
    ) {
        for p in paths {
            self.opt(name, Some(p.as_ref().display()));
        }
    }

    /// `--name` when set.
    pub fn flag(&mut self, name: &str, set: bool) {
        if set {
            self.0.push(format!("--{name}"));
        }
    }

    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::Argv;

    #[test]
    fn values_that_look_like_options_or_hold_variables_are_joined() {
        let mut a = Argv::new();
        a.positional("src");
        a.opt("size", Some(10));
        a.opt("user", Some("-x"));
        a.opt("header", Some("A: $(SECRET)"));
        a.opt("none", None::<u8>);
        a.flag("archive", true);
        a.flag("json", false);
        a.paths("ca", &[std::path::PathBuf::from("/a"), "/b".into()]);
        assert_eq!(
            a.into_vec(),
            [
                "src",
                "--size",
                "10",
                "--user=-x",
                "--header=A: $(SECRET)",
                "--archive",
                "--ca",
                "/a",
                "--ca",
                "/b"
            ]
        );
    }
}

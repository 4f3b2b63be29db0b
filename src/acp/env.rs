//! Where a runtime's environment comes from besides `PATH`, `HOME`, `LANG` and the profile's
//! written `env`: variables passed through from the harness's own environment, and values read
//! from files (a mounted Secret), so that API keys never sit in a config file.
//!
//! The values are read when a runtime starts (a rotated secret file reaches the next runtime),
//! go straight into the child's environment and are never kept, printed or logged: an error
//! names the variable and the file, never the value.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    os::unix::ffi::OsStringExt,
    path::{Path, PathBuf},
};

/// The largest value a file may hold: a key or a token, not a document.
pub const MAX_FILE_VALUE_BYTES: u64 = 64 * 1024;

/// A profile's secret-bearing environment: names, never values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSources {
    /// Variables copied from the harness's environment when they are set there (an unset one
    /// is left out).
    pub passthrough: Vec<String>,
    /// Variables whose value is the content of a file (one trailing newline dropped).
    pub files: BTreeMap<String, PathBuf>,
}

impl EnvSources {
    pub fn is_empty(&self) -> bool {
        self.passthrough.is_empty() && self.files.is_empty()
    }

    /// The passed-through variables that the harness's environment lacks (said at start, so a
    /// forgotten key is noticed before an agent complains).
    pub fn unset_passthrough(&self) -> Vec<&str> {
        self.passthrough
            .iter()
            .filter(|name| std::env::var_os(name).is_none())
            .map(String::as_str)
            .collect()
    }

    /// The variables and their values, read now. An unreadable or unfit file is an error that
    /// names the variable and the path (its content never appears in it).
    pub fn read(&self) -> Result<Vec<(OsString, OsString)>, String> {
        let mut env: Vec<(OsString, OsString)> = self
            .passthrough
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|value| (name.into(), value)))
            .collect();
        for (name, path) in &self.files {
            env.push((name.into(), read_value(name, path)?));
        }
        Ok(env)
    }
}

/// One file's value: its bytes without one trailing newline (`\n` or `\r\n`, as `echo` and
/// editors leave it).
fn read_value(name: &str, path: &Path) -> Result<OsString, String> {
    let fail = |why: String| format!("env_files.{name}: {}: {why}", path.display());
    let metadata = std::fs::metadata(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    if !metadata.is_file() {
        return Err(fail("not a file".into()));
    }
    if metadata.len() > MAX_FILE_VALUE_BYTES {
        return Err(fail(format!(
            "{} bytes, over the limit of {MAX_FILE_VALUE_BYTES} for one value",
            metadata.len()
        )));
    }
    let mut bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    if bytes.contains(&0) {
        return Err(fail(
            "holds a NUL byte, which no environment value can".into(),
        ));
    }
    Ok(OsString::from_vec(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_value_loses_one_trailing_newline_and_errors_never_show_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "s3cret-value\r\n").unwrap();
        let sources = EnvSources {
            passthrough: vec!["PATH".into(), "SURELY_UNSET_IN_TESTS_42".into()],
            files: BTreeMap::from([("API_KEY".into(), key.clone())]),
        };
        let env = sources.read().unwrap();
        assert!(env.iter().any(|(k, _)| k == "PATH"));
        assert!(!env.iter().any(|(k, _)| k == "SURELY_UNSET_IN_TESTS_42"));
        assert!(env.contains(&("API_KEY".into(), "s3cret-value".into())));
        assert_eq!(sources.unset_passthrough(), ["SURELY_UNSET_IN_TESTS_42"]);

        std::fs::write(&key, b"s3cret\0value").unwrap();
        let err = sources.read().unwrap_err();
        assert!(
            err.contains("env_files.API_KEY") && err.contains("NUL"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        let missing = EnvSources {
            files: BTreeMap::from([("API_KEY".into(), dir.path().join("gone"))]),
            ..Default::default()
        };
        let err = missing.read().unwrap_err();
        assert!(
            err.contains("env_files.API_KEY") && err.contains("gone"),
            "{err}"
        );
        std::fs::write(&key, vec![b'k'; MAX_FILE_VALUE_BYTES as usize + 1]).unwrap();
        assert!(sources.read().unwrap_err().contains("over the limit"));
    }
}

//! Where a session may work. Its cwd is absolute, exists, and — canonical — lies under one of
//! its profile's `allowed_cwd_roots` as expanded for its owner (`/srv/workspaces/{principal}`),
//! lies in none of the server's paths (its data dir, the agents' HOMEs, config, tokens file, TLS
//! keys, secrets) and holds none of its files (it may hold its data dir: the box covers it). It is checked when the session is created and again
//! before every runtime start, so a component swapped for a link in between is refused. Every
//! refusal reads the same ("not under an allowed root of this profile"): it never tells whose
//! root a path is, or that a path of the server's is there.

use std::path::{Path, PathBuf};

use crate::acp::sandbox::ServerPaths;

/// What the file system says of a cwd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    NotADirectory,
    Directory {
        canonical: PathBuf,
        /// Whether it lies under one of the roots (`None`: the profile has none).
        allowed: Option<bool>,
    },
}

/// `roots` as they apply to `owner`: `{principal}` replaced by the owner's name, and a root that
/// holds it left out when the name cannot stand as a path component (`..`, `/`, spaces).
pub(crate) fn roots_for(roots: &[PathBuf], owner: &str) -> Vec<PathBuf> {
    crate::acp::sandbox::workspace_roots(roots, owner)
}

/// Canonicalises `path` and judges it against `roots` (already expanded) and `forbidden` (the
/// server's files: a cwd overlapping one is outside every root). Asks the file system, so run
/// it on a blocking thread.
pub(crate) fn look_up(
    path: &Path,
    roots: Option<&[PathBuf]>,
    forbidden: &ServerPaths,
) -> std::io::Result<Lookup> {
    let canonical = std::fs::canonicalize(path)?;
    if !canonical.is_dir() {
        return Ok(Lookup::NotADirectory);
    }
    let clear = !forbidden.clash_with(&canonical);
    let allowed = match roots {
        None if clear => None,
        None => Some(false),
        Some(roots) => Some(
            clear
                && roots.iter().any(|root| {
                    std::fs::canonicalize(root).is_ok_and(|root| canonical.starts_with(root))
                }),
        ),
    };
    Ok(Lookup::Directory { canonical, allowed })
}

/// [`look_up`] on a blocking thread: a slow or hung mount must not stall the runtime's worker
/// threads (every session on them).
pub(crate) async fn look_up_on_a_thread(
    path: PathBuf,
    roots: Option<Vec<PathBuf>>,
    forbidden: ServerPaths,
) -> std::io::Result<Lookup> {
    let looked_up =
        tokio::task::spawn_blocking(move || look_up(&path, roots.as_deref(), &forbidden)).await;
    looked_up.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_root_expands_for_plain_names_only() {
        let roots = vec![
            PathBuf::from("/srv/workspaces/{principal}"),
            PathBuf::from("/shared"),
        ];
        assert_eq!(
            roots_for(&roots, "alice"),
            vec![
                PathBuf::from("/srv/workspaces/alice"),
                PathBuf::from("/shared")
            ]
        );
        for odd in ["..", "a/b", "", "../../etc"] {
            assert_eq!(
                roots_for(&roots, odd),
                vec![PathBuf::from("/shared")],
                "{odd:?}"
            );
        }
    }

    #[test]
    fn a_cwd_in_a_server_path_or_holding_a_server_file_is_not_allowed_whatever_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let data = base.join("data");
        let work = base.join("work");
        std::fs::create_dir_all(data.join("inside")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(base.join("config.toml"), "").unwrap();
        let forbidden = ServerPaths {
            protected: vec![data.clone(), base.join("config.toml")],
            homes_dir: data.join("homes"),
        };
        let judge = |path: &Path, roots: Option<&[PathBuf]>| match look_up(path, roots, &forbidden)
            .unwrap()
        {
            Lookup::Directory { allowed, .. } => allowed,
            Lookup::NotADirectory => panic!("a directory"),
        };
        let roots = [base.clone()];
        assert_eq!(judge(&work, Some(&roots)), Some(true));
        assert_eq!(
            judge(&base, Some(&roots)),
            Some(false),
            "it holds the config file"
        );
        assert_eq!(judge(&data.join("inside"), Some(&roots)), Some(false));
        assert_eq!(judge(&work, None), None, "no roots: any clear path");
        assert_eq!(judge(&base, None), Some(false));
        // A directory of the server's may lie in a cwd (the box covers it); a file may not,
        // nor a path that is not there yet (it may become one).
        std::fs::remove_file(base.join("config.toml")).unwrap();
        assert_eq!(judge(&base, Some(&roots)), Some(false), "a missing file");
        std::fs::write(base.join("config.toml"), "").unwrap();
        let project = base.join("project");
        std::fs::create_dir_all(project.join("data")).unwrap();
        let in_project = ServerPaths {
            protected: vec![project.join("data"), base.join("config.toml")],
            homes_dir: project.join("data/homes"),
        };
        match look_up(&project, None, &in_project).unwrap() {
            Lookup::Directory { allowed, .. } => assert_eq!(allowed, None, "it holds the data dir"),
            Lookup::NotADirectory => panic!("a directory"),
        }
        // A link to the data dir resolves to it.
        std::os::unix::fs::symlink(&data, work.join("link")).unwrap();
        assert_eq!(judge(&work.join("link"), Some(&roots)), Some(false));
    }
}

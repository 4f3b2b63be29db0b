//! The agents' HOMEs: one per owner and profile, `<homes_dir>/<profile>/<owner>`. Not one per
//! session: an agent keeps its sessions' files there, and a fork reads its parent's. Never one
//! shared by owners: what one user's agent leaves there is another's to read otherwise. Replicas
//! may share `homes_dir` (a session reopened on another replica finds its agent's files).
//!
//! A HOME is made when its first session starts (mode 0700, owned by the agent's uid when the
//! server is root) and filled from the profile's seed before every start: the seed's files are
//! written over the HOME's (they are the operator's configuration), everything else the agent
//! wrote stays.

use std::{
    io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The directory name of an owner in `homes_dir`: the principal itself when it is a plain
/// name, else `~` and a digest of it (`~` never starts a plain name, so the two cannot meet).
pub fn owner_dir_name(owner: &str) -> String {
    match crate::domain::principal::path_segment(owner) {
        Some(name) => name.to_owned(),
        None => {
            use sha2::{Digest, Sha256};
            format!("~{}", &hex::encode(Sha256::digest(owner.as_bytes()))[..32])
        }
    }
}

/// Where `owner`'s runtimes of `profile` keep their HOME.
pub fn home_path(homes_dir: &Path, profile: &str, owner: &str) -> PathBuf {
    homes_dir.join(profile).join(owner_dir_name(owner))
}

/// The most bytes and files a seed may hold: it is configuration, copied before every start.
const MAX_SEED_BYTES: u64 = 64 << 20;
const MAX_SEED_FILES: usize = 10_000;

/// Makes `home` if it is missing and copies `seed` into it; as root, everything made is given
/// to `owner_ids` (the agent's uid and gid). Refuses a HOME that is a symbolic link or not a
/// directory (something put there meant to redirect the agent's writes).
pub fn prepare_home(
    home: &Path,
    seed: Option<&Path>,
    owner_ids: Option<(u32, u32)>,
) -> io::Result<()> {
    if let Some(parent) = home.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Sessions of one owner starting at once (or on replicas sharing `homes_dir`) prepare the
    // same HOME: one at a time, so none finds it made but not yet given to the agent's uid, nor
    // a seed file another is writing.
    let _lock = lock_home(home)?;
    match std::fs::create_dir(home) {
        Ok(()) => {
            std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
            if let Some((uid, gid)) = owner_ids {
                std::os::unix::fs::lchown(home, Some(uid), Some(gid))?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(home)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a link or file where a HOME belongs)",
            home.display()
        )));
    }
    if let Some((uid, _)) = owner_ids
        && meta.uid() != uid
    {
        return Err(io::Error::other(format!(
            "{} belongs to uid {}, not to the agents' uid {uid}",
            home.display(),
            meta.uid()
        )));
    }
    if let Some(seed) = seed {
        let mut budget = (MAX_SEED_BYTES, MAX_SEED_FILES);
        copy_seed(seed, home, owner_ids, &mut budget).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "copying the HOME seed {} into {}: {e}",
                    seed.display(),
                    home.display()
                ),
            )
        })?;
    }
    Ok(())
}

/// Copies the files and directories of `from` into `to` (links are not followed in either, and
/// an entry of the HOME that is a link where the seed has a file is replaced, never written
/// through).
fn copy_seed(
    from: &Path,
    to: &Path,
    owner_ids: Option<(u32, u32)>,
    budget: &mut (u64, usize),
) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        budget.1 = budget
            .1
            .checked_sub(1)
            .ok_or_else(|| io::Error::other("the seed holds too many files"))?;
        let existing = std::fs::symlink_metadata(&target).ok();
        if kind.is_dir() {
            match existing {
                Some(meta) if meta.is_dir() => {}
                Some(_) => {
                    std::fs::remove_file(&target)?;
                    make_dir(&target, owner_ids)?;
                }
                None => make_dir(&target, owner_ids)?,
            }
            copy_seed(&source, &target, owner_ids, budget)?;
        } else if kind.is_file() {
            let size = entry.metadata()?.len();
            budget.0 = budget
                .0
                .checked_sub(size)
                .ok_or_else(|| io::Error::other("the seed is too large"))?;
            if let Some(meta) = existing {
                if meta.is_dir() {
                    return Err(io::Error::other(format!(
                        "{} is a directory in the HOME and a file in the seed",
                        target.display()
                    )));
                }
                std::fs::remove_file(&target)?;
            }
            // Written to a fresh file: a link the agent left there is removed above, not followed.
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut out = options.open(&target)?;
            io::copy(&mut std::fs::File::open(&source)?, &mut out)?;
            if let Some((uid, gid)) = owner_ids {
                std::os::unix::fs::fchown(&out, Some(uid), Some(gid))?;
            }
        }
        // Links and special files in a seed are left out.
    }
    Ok(())
}

/// An exclusive lock on `home`'s preparation, held until the file is dropped: a lock file
/// beside it, `~<name>.lock` (`~` starts no plain owner name, and a digest name holds no `.`,
/// so it never meets an owner's directory). Agents never see it: the box covers `homes_dir`.
fn lock_home(home: &Path) -> io::Result<std::fs::File> {
    let name = home
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no HOME", home.display())))?;
    let mut lock_name = std::ffi::OsString::from("~");
    lock_name.push(name);
    lock_name.push(".lock");
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let file = options.open(home.with_file_name(lock_name))?;
    file.lock()?;
    Ok(file)
}

fn make_dir(path: &Path, owner_ids: Option<(u32, u32)>) -> io::Result<()> {
    std::fs::create_dir(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    if let Some((uid, gid)) = owner_ids {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Bytes a HOME takes on disk (what its files hold), counted up to `limit` entries.
pub fn disk_use(home: &Path, limit: usize) -> u64 {
    let mut total = 0;
    let mut seen = 0;
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            seen += 1;
            if seen > limit {
                return total;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_get_their_own_directory_and_odd_principals_a_digest() {
        let homes = Path::new("/homes");
        assert_eq!(
            home_path(homes, "claude", "alice"),
            Path::new("/homes/claude/alice")
        );
        let odd = home_path(homes, "claude", "../root");
        assert!(
            odd.to_string_lossy().starts_with("/homes/claude/~"),
            "{}",
            odd.display()
        );
        assert_ne!(owner_dir_name("a b"), owner_dir_name("a  b"));
        assert_eq!(owner_dir_name(".."), owner_dir_name(".."));
        assert!(owner_dir_name("..").starts_with('~'));
    }

    #[test]
    fn a_seed_is_written_over_the_home_and_links_there_are_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed");
        std::fs::create_dir_all(seed.join(".codex")).unwrap();
        std::fs::write(seed.join(".codex/config.toml"), "model = \"x\"\n").unwrap();
        let home = dir.path().join("homes/codex/alice");
        prepare_home(&home, Some(&seed), None).unwrap();
        assert_eq!(
            std::fs::read_to_string(home.join(".codex/config.toml")).unwrap(),
            "model = \"x\"\n"
        );
        let mode = std::fs::metadata(&home).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // An agent replaced the file by a link to somewhere else: the next start writes the
        // seed's file in its place and leaves the link's target alone.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "untouched").unwrap();
        std::fs::remove_file(home.join(".codex/config.toml")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, home.join(".codex/config.toml")).unwrap();
        std::fs::write(home.join("notes"), "the agent's own").unwrap();
        prepare_home(&home, Some(&seed), None).unwrap();
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
        assert!(
            !std::fs::symlink_metadata(home.join(".codex/config.toml"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(home.join("notes")).unwrap(),
            "the agent's own"
        );
        // A HOME that is a link is refused.
        let linked = dir.path().join("homes/codex/bob");
        std::os::unix::fs::symlink(dir.path(), &linked).unwrap();
        assert!(prepare_home(&linked, None, None).is_err());
    }

    #[test]
    fn sessions_starting_at_once_each_find_their_home_whole() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed");
        std::fs::create_dir_all(seed.join(".config/agent")).unwrap();
        for i in 0..50 {
            std::fs::write(seed.join(format!(".config/agent/{i}.json")), "{}").unwrap();
        }
        let home = dir.path().join("homes/mock/alice");
        // As root, the HOME is given to another uid, as the agents' is.
        // SAFETY: a plain getter.
        let owner_ids = (unsafe { libc::geteuid() } == 0).then_some((65532, 65532));
        std::thread::scope(|scope| {
            let starts: Vec<_> = (0..16)
                .map(|_| scope.spawn(|| prepare_home(&home, Some(&seed), owner_ids)))
                .collect();
            for start in starts {
                start
                    .join()
                    .unwrap()
                    .expect("every start prepares the HOME");
            }
        });
        assert_eq!(
            std::fs::read_dir(home.join(".config/agent"))
                .unwrap()
                .count(),
            50
        );
        // The lock lies beside the HOME, never in it.
        assert!(dir.path().join("homes/mock/~alice.lock").is_file());
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 1);
    }
}

//! Resource limits of a runtime's whole process tree, by cgroups: version 2 where the machine
//! has it for the controller, version 1 where that is what it has (each controller its own
//! hierarchy). Each runtime gets a cgroup of its own under a parent the harness owns (by default
//! `agent-harness` under the server's own cgroup, so a container's limits still cover it); the
//! launcher joins it before it starts anything, and it is removed once the runtime is gone.
//!
//! Memory: past the limit the kernel's OOM killer acts. Version 2 kills the whole cgroup
//! (`memory.oom.group`); version 1 kills one process, so the harness watches for the OOM event
//! and kills the rest of the runtime itself — a runtime is whole or gone, never a shell without
//! its tool. Either way the session learns the reason ("memory limit 2 GiB reached").
//! Not `RLIMIT_AS` (it breaks Node, which reserves far more address space than it uses) and not
//! `RLIMIT_NPROC` (counted per uid: one tenant's fork bomb would starve every other).

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use super::policy::{Limits, format_size};

/// A controller the harness limits with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    const ALL: [Self; 3] = [Self::Memory, Self::Pids, Self::Cpu];

    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpu => "cpu",
        }
    }
}

/// Where one controller's runtime cgroups go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    v2: bool,
    /// The parent of the runtimes' cgroups.
    parent: PathBuf,
}

/// The cgroup hierarchies of this machine that the harness can limit runtimes with.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    places: BTreeMap<Controller, Place>,
    /// Why a controller is not available, for errors and the start log.
    missing: BTreeMap<Controller, String>,
}

/// The name of the harness's parent cgroup under its own, when no `sandbox.cgroup` says where.
const DEFAULT_PARENT: &str = "agent-harness";
/// The prefix of each runtime's cgroup name (leftovers of a crashed harness are found by it).
const RUNTIME_PREFIX: &str = "rt-";

impl Cgroups {
    /// Finds the hierarchies from `/proc/self/mountinfo` and `/proc/self/cgroup`. `parent`: the
    /// runtimes' parent cgroup, as a path inside each hierarchy (`sandbox.cgroup`); by default
    /// `agent-harness` under this process's own cgroup.
    pub fn detect(parent: Option<&Path>) -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self::from_tables(&mountinfo, &own, parent, |dir| {
            dir.join("cgroup.controllers")
        })
    }

    fn from_tables(
        mountinfo: &str,
        own: &str,
        parent: Option<&Path>,
        controllers_file: impl Fn(&Path) -> PathBuf,
    ) -> Self {
        let mut v1_mounts: BTreeMap<&str, PathBuf> = BTreeMap::new();
        let mut v2_mount = None;
        for line in mountinfo.lines() {
            // id parent major:minor root mount-point options [optional…] - fstype source super
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).map(unescape_mount_path);
            let mut right = right.split(' ');
            let fstype = right.next().unwrap_or_default();
            let super_options = right.nth(1).unwrap_or_default();
            match (fstype, mount_point) {
                ("cgroup2", Some(point)) => v2_mount = Some(point),
                ("cgroup", Some(point)) => {
                    for option in super_options.split(',') {
                        if let Some(controller) =
                            Controller::ALL.iter().find(|c| c.name() == option)
                        {
                            v1_mounts.entry(controller.name()).or_insert(point.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        let mut own_v1: BTreeMap<String, String> = BTreeMap::new();
        let mut own_v2 = None;
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if controllers.is_empty() {
                own_v2 = Some(path.to_owned());
            }
            for controller in controllers.split(',') {
                own_v1.insert(controller.to_owned(), path.to_owned());
            }
        }
        let v2_controllers: Vec<String> = v2_mount
            .as_ref()
            .and_then(|mount| std::fs::read_to_string(controllers_file(mount)).ok())
            .map(|text| text.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let mut cgroups = Self::default();
        for controller in Controller::ALL {
            let name = controller.name();
            let place = if let Some(mount) = v1_mounts.get(name) {
                let own = own_v1.get(name).map(String::as_str).unwrap_or("/");
                Some(Place {
                    v2: false,
                    parent: parent_dir(mount, own, parent),
                })
            } else if let Some(mount) = v2_mount
                .as_ref()
                .filter(|_| v2_controllers.iter().any(|c| c == name))
            {
                let own = own_v2.as_deref().unwrap_or("/");
                Some(Place {
                    v2: true,
                    parent: parent_dir(mount, own, parent),
                })
            } else {
                None
            };
            match place {
                Some(place) => {
                    cgroups.places.insert(controller, place);
                }
                None => {
                    cgroups.missing.insert(
                        controller,
                        format!("no cgroup hierarchy has the {name} controller here"),
                    );
                }
            }
        }
        cgroups
    }

    /// One line for the start log: which controllers, which version, where.
    pub fn describe(&self) -> String {
        if self.places.is_empty() {
            return "no cgroup controllers: memory, pids and cpu limits cannot be enforced".into();
        }
        let parts: Vec<String> = self
            .places
            .iter()
            .map(|(c, p)| {
                format!(
                    "{} (v{}) under {}",
                    c.name(),
                    if p.v2 { 2 } else { 1 },
                    p.parent.display()
                )
            })
            .collect();
        parts.join(", ")
    }

    /// Whether the runtimes' parent cgroup of each controller `limits` needs can be written
    /// (created if missing); the first reason it cannot.
    pub fn check(&self, limits: &Limits) -> Result<(), String> {
        for controller in needed(limits) {
            let place = self.place(controller)?;
            prepare_parent(place, controller).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn place(&self, controller: Controller) -> Result<&Place, String> {
        self.places.get(&controller).ok_or_else(|| {
            self.missing
                .get(&controller)
                .cloned()
                .unwrap_or_else(|| format!("the {} controller is missing", controller.name()))
        })
    }

    /// A cgroup of its own for one runtime, with `limits` set; `None` when `limits` set none.
    pub fn create(&self, name: &str, limits: &Limits) -> io::Result<Option<RuntimeCgroup>> {
        let controllers = needed(limits);
        if controllers.is_empty() {
            return Ok(None);
        }
        let mut cgroup = RuntimeCgroup {
            dirs: Vec::new(),
            memory: None,
            memory_limit: limits.memory,
        };
        for controller in controllers {
            let place = self.place(controller).map_err(io::Error::other)?;
            prepare_parent(place, controller)?;
            let dir = place.parent.join(format!("{RUNTIME_PREFIX}{name}"));
            if !cgroup.dirs.contains(&dir) {
                std::fs::create_dir(&dir).or_else(|e| match e.kind() {
                    io::ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(described(e, &dir, "creating the runtime's cgroup")),
                })?;
                cgroup.dirs.push(dir.clone());
            }
            // Whatever fails below leaves the directory for `remove` (on drop of `cgroup`).
            match (controller, place.v2) {
                (Controller::Memory, v2) => {
                    let bytes = limits.memory.expect("needed").to_string();
                    if v2 {
                        write(&dir, "memory.max", &bytes)?;
                        // Swap would let a runtime pass its limit unseen.
                        let _ = write(&dir, "memory.swap.max", "0");
                        // The whole runtime goes, not one tool of it.
                        write(&dir, "memory.oom.group", "1")?;
                    } else {
                        write(&dir, "memory.limit_in_bytes", &bytes)?;
                        if dir.join("memory.memsw.limit_in_bytes").exists() {
                            let _ = write(&dir, "memory.memsw.limit_in_bytes", &bytes);
                        }
                    }
                    cgroup.memory = Some((dir.clone(), place.v2));
                }
                (Controller::Pids, _) => {
                    write(&dir, "pids.max", &limits.pids.expect("needed").to_string())?;
                }
                (Controller::Cpu, v2) => {
                    let millis = limits.cpu_millis.expect("needed");
                    let period = 100_000u64;
                    let quota = (millis * period / 1000).max(1000);
                    if v2 {
                        write(&dir, "cpu.max", &format!("{quota} {period}"))?;
                    } else {
                        write(&dir, "cpu.cfs_period_us", &period.to_string())?;
                        write(&dir, "cpu.cfs_quota_us", &quota.to_string())?;
                    }
                }
            }
        }
        Ok(Some(cgroup))
    }

    /// Removes empty runtime cgroups whose name (after the prefix) `ours` says were left by a
    /// previous process. How many.
    pub fn remove_leftovers(&self, ours: impl Fn(&str) -> bool) -> usize {
        let mut removed = 0;
        let parents: std::collections::BTreeSet<&PathBuf> =
            self.places.values().map(|p| &p.parent).collect();
        for parent in parents {
            for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.strip_prefix(RUNTIME_PREFIX).is_some_and(&ours)
                    && std::fs::remove_dir(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// The controllers `limits` needs.
fn needed(limits: &Limits) -> Vec<Controller> {
    let mut controllers = Vec::new();
    if limits.memory.is_some() {
        controllers.push(Controller::Memory);
    }
    if limits.pids.is_some() {
        controllers.push(Controller::Pids);
    }
    if limits.cpu_millis.is_some() {
        controllers.push(Controller::Cpu);
    }
    controllers
}

fn parent_dir(mount: &Path, own: &str, configured: Option<&Path>) -> PathBuf {
    match configured {
        Some(path) => mount.join(path.strip_prefix("/").unwrap_or(path)),
        None => mount.join(own.trim_start_matches('/')).join(DEFAULT_PARENT),
    }
}

/// `mountinfo` escapes spaces and the like as `\040`.
fn unescape_mount_path(text: &str) -> PathBuf {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(code) = u8::from_str_radix(&text[i + 1..i + 4], 8)
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// Creates the runtimes' parent cgroup if needed; under version 2 it also hands the controller
/// down to the runtimes' cgroups (`cgroup.subtree_control` of the parent and its own parent).
fn prepare_parent(place: &Place, controller: Controller) -> io::Result<()> {
    if !place.parent.is_dir() {
        std::fs::create_dir_all(&place.parent).map_err(|e| {
            described(
                e,
                &place.parent,
                "creating the runtimes' parent cgroup (the server needs root, or a delegated \
                 cgroup named by sandbox.cgroup)",
            )
        })?;
    }
    if place.v2 {
        let enable = format!("+{}", controller.name());
        if let Some(above) = place.parent.parent() {
            let enabled =
                std::fs::read_to_string(above.join("cgroup.subtree_control")).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == controller.name()) {
                write(above, "cgroup.subtree_control", &enable).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{e} (under cgroup v2 a cgroup that holds processes cannot hand \
                             controllers down: point sandbox.cgroup at a delegated cgroup of \
                             its own)"
                        ),
                    )
                })?;
            }
        }
        let enabled = std::fs::read_to_string(place.parent.join("cgroup.subtree_control"))
            .unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == controller.name()) {
            write(&place.parent, "cgroup.subtree_control", &enable)?;
        }
    }
    Ok(())
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(|e| described(e, &path, "writing"))
}

fn described(error: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(error.kind(), format!("{what} {}: {error}", path.display()))
}

/// One runtime's cgroup (a directory per hierarchy).
#[derive(Debug)]
pub struct RuntimeCgroup {
    dirs: Vec<PathBuf>,
    /// The memory controller's directory, and whether it is version 2.
    memory: Option<(PathBuf, bool)>,
    memory_limit: Option<u64>,
}

impl RuntimeCgroup {
    /// The directories the launcher joins.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Whether the kernel killed a process of this runtime for memory, and the reason to give.
    pub fn memory_exceeded(&self) -> Option<String> {
        let (dir, v2) = self.memory.as_ref()?;
        let (file, key) = match v2 {
            true => ("memory.events", "oom_kill"),
            false => ("memory.oom_control", "oom_kill"),
        };
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        let kills: u64 = text.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == key).then(|| value.trim().parse().ok()).flatten()
        })?;
        // Version 1 kernels without the counter still report `under_oom`; version 1's failcnt
        // counts reclaim attempts, not kills, so it is not used.
        (kills > 0).then(|| self.memory_reason())
    }

    /// "memory limit 2 GiB reached".
    pub fn memory_reason(&self) -> String {
        format!(
            "memory limit {} reached",
            format_size(self.memory_limit.unwrap_or_default())
        )
    }

    /// Under version 1 an eventfd that becomes readable when the OOM killer acts in this cgroup
    /// (version 2 kills the whole cgroup itself: `None`).
    pub fn oom_events(&self) -> io::Result<Option<std::os::fd::OwnedFd>> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let Some((dir, false)) = &self.memory else {
            return Ok(None);
        };
        // SAFETY: eventfd returns a new fd or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        let efd = unsafe { std::os::fd::OwnedFd::from_raw_fd(efd) };
        let control = std::fs::File::open(dir.join("memory.oom_control"))?;
        std::fs::write(
            dir.join("cgroup.event_control"),
            format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()),
        )?;
        Ok(Some(efd))
    }

    /// Removes the directories once nothing of the runtime is left (a few tries: the kernel
    /// may still be tearing the last process down).
    pub fn remove(&self) {
        for dir in &self.dirs {
            for attempt in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if attempt < 49 => {
                        std::thread::sleep(std::time::Duration::from_millis(10))
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove a runtime's cgroup");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTINFO: &str = "\
30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
32 30 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
";
    const V1_OWN: &str = "\
9:pids:/
4:memory:/process_api/abc
1:cpu,cpuacct:/
0::/
";

    #[test]
    fn version_1_controllers_are_found_in_their_own_hierarchies_under_the_servers_cgroup() {
        let cgroups = Cgroups::from_tables(V1_MOUNTINFO, V1_OWN, None, |_| {
            PathBuf::from("/nonexistent")
        });
        let memory = &cgroups.places[&Controller::Memory];
        assert!(!memory.v2);
        assert_eq!(
            memory.parent,
            Path::new("/sys/fs/cgroup/memory/process_api/abc/agent-harness")
        );
        assert_eq!(
            cgroups.places[&Controller::Pids].parent,
            Path::new("/sys/fs/cgroup/pids/agent-harness")
        );
        assert_eq!(
            cgroups.places[&Controller::Cpu].parent,
            Path::new("/sys/fs/cgroup/cpu,cpuacct/agent-harness")
        );
        let configured = Cgroups::from_tables(
            V1_MOUNTINFO,
            V1_OWN,
            Some(Path::new("/delegated/harness")),
            |_| PathBuf::from("/nonexistent"),
        );
        assert_eq!(
            configured.places[&Controller::Memory].parent,
            Path::new("/sys/fs/cgroup/memory/delegated/harness")
        );
    }

    #[test]
    fn version_2_serves_the_controllers_its_root_lists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        let mountinfo = format!(
            "25 24 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            dir.path().display()
        );
        let cgroups = Cgroups::from_tables(
            &mountinfo,
            "0::/system.slice/harness.service\n",
            None,
            |m| m.join("cgroup.controllers"),
        );
        let memory = &cgroups.places[&Controller::Memory];
        assert!(memory.v2);
        assert_eq!(
            memory.parent,
            dir.path()
                .join("system.slice/harness.service/agent-harness")
        );
        assert!(cgroups.places.contains_key(&Controller::Pids));
        let none = Cgroups::from_tables("", "", None, |m| m.to_path_buf());
        assert!(
            none.check(&Limits {
                memory: Some(1),
                ..Default::default()
            })
            .is_err()
        );
        assert!(none.check(&Limits::default()).is_ok());
    }
}

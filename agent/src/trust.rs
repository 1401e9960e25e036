//! What the agent takes from disk and hands to every later runner, and who may change it
//! (CONTRACT §7): the runner package source (`runner.package_dir`) and each policy's
//! `env_file`. A job that can change either (the classic layout puts the package in a runner
//! account's home) backdoors every runner started after the next restart, so `run` refuses to
//! start (exit 2) and `check` fails while any directory on the way to one of them, or the thing
//! itself, is owned by a runner uid or writable by its group or by other users. Also the kernel's
//! link protections (`fs.protected_symlinks`, `fs.protected_hardlinks`) the isolation relies on,
//! which `check` requires.
//!
//! The decision is [`judge`], pure (a path's trail of owners and modes and the uid pool in, the
//! first problem out); [`trail`] is the thin adapter that reads the trail, and
//! [`refuse_changeable`] what `run` calls.
//!
//! A sticky directory that others may write (`/tmp`) lets them add entries but not rename or
//! remove an entry they do not own: such a directory is accepted on the way only where the entry
//! taken in it is owned by root or by the agent. Anything else group- or other-writable is
//! refused, even where the group looks harmless: one rule an operator can check by eye.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};

use crate::config::{Config, display_file};
use crate::exit::Exit;
use rm_runner::isolate::Pool;

/// How many symbolic links [`trail`] follows before it gives up (the kernel's own limit,
/// `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The mode bits that let a group or other users write.
const GROUP_OR_OTHER_WRITE: u32 = 0o022;
/// The sticky bit: in a directory, only an entry's owner (or the directory's, or root) may
/// rename or remove the entry.
const STICKY: u32 = 0o1000;

/// The two link protections and the fix for each, as `check` names them.
const PROTECTED_LINKS: [(&str, &str); 2] = [
    ("fs.protected_symlinks", "/proc/sys/fs/protected_symlinks"),
    ("fs.protected_hardlinks", "/proc/sys/fs/protected_hardlinks"),
];

/// One object met on the way to a path: a directory looked in, a link followed, or the file or
/// directory at the end. `mode` is the whole `st_mode` (type and permission bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub path: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// `S_IFMT`, `S_IFDIR`, `S_IFLNK`: the file type bits of `st_mode` and two of their values.
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

impl Step {
    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    fn is_link(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }
}

/// Why a job could change what the agent trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Untrusted {
    /// A runner uid owns this step: a job under that uid can change it at will.
    OwnedByRunner { path: PathBuf, uid: u32 },
    /// This step is writable by its group or by every user.
    Writable { path: PathBuf, mode: u32 },
    /// A sticky directory others may write holds an entry on the way that is neither root's nor
    /// the agent's: its owner may replace it.
    InSharedDir {
        dir: PathBuf,
        mode: u32,
        entry: PathBuf,
        uid: u32,
    },
}

impl Untrusted {
    /// The problem and its fix, as one sentence ("problem; fix") for `run` and `check`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Untrusted::OwnedByRunner { path, uid } => format!(
                "{} is owned by runner uid {uid}, so a job could change it; move what rm reads out of the runner accounts' reach (e.g. under /opt, owned by root) or run `chown root:root {}`",
                path.display(),
                path.display()
            ),
            Untrusted::Writable { path, mode } => format!(
                "{} is writable by {} (mode {:o}), so a job could change it; run `chmod go-w {}`",
                path.display(),
                if mode & 0o002 != 0 {
                    "every user"
                } else {
                    "its group"
                },
                mode & 0o7777,
                path.display()
            ),
            Untrusted::InSharedDir {
                dir,
                mode,
                entry,
                uid,
            } => format!(
                "{} lies in {}, which every user may write (mode {:o}), and is owned by uid {uid}, not root or the agent, so it could be replaced; move it out of {} or run `chown root:root {}`",
                entry.display(),
                dir.display(),
                mode & 0o7777,
                dir.display(),
                entry.display()
            ),
        }
    }
}

/// The first step of `trail` (from `/` down to the thing itself) that a job could change, if
/// any: a step owned by a uid of `pool`; a directory or file writable by its group or other
/// users, except a sticky directory whose entries on the way are all owned by root or by
/// `agent_uid`. A link's own mode means nothing (always `0777`); its owner does.
pub(crate) fn judge(trail: &[Step], pool: &Pool, agent_uid: u32) -> Option<Untrusted> {
    for (index, step) in trail.iter().enumerate() {
        if pool.contains_uid(step.uid) {
            return Some(Untrusted::OwnedByRunner {
                path: step.path.clone(),
                uid: step.uid,
            });
        }
        if step.is_link() || step.mode & GROUP_OR_OTHER_WRITE == 0 {
            continue;
        }
        // The entries looked up in this directory on the way (a link's target may come back
        // through it).
        let mut entries = trail[index + 1..]
            .iter()
            .filter(|later| later.path.parent() == Some(step.path.as_path()))
            .peekable();
        let sticky_dir = step.is_dir() && step.mode & STICKY != 0;
        if !sticky_dir || entries.peek().is_none() {
            return Some(Untrusted::Writable {
                path: step.path.clone(),
                mode: step.mode,
            });
        }
        if let Some(entry) = entries.find(|e| e.uid != 0 && e.uid != agent_uid) {
            return Some(Untrusted::InSharedDir {
                dir: step.path.clone(),
                mode: step.mode,
                entry: entry.path.clone(),
                uid: entry.uid,
            });
        }
    }
    None
}

/// A path's part still to resolve.
enum Part {
    Parent,
    Name(OsString),
}

fn parts(path: &Path) -> impl Iterator<Item = Part> + '_ {
    path.components().filter_map(|c| match c {
        Component::ParentDir => Some(Part::Parent),
        Component::Normal(name) => Some(Part::Name(name.to_owned())),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

/// Every object the kernel meets resolving `path`, in order: `/`, each directory a name is
/// looked up in, each symbolic link (then the way to its target), and the object at the end.
/// Read without following anything by hand, so a link's own directory is judged too.
pub(crate) fn trail(path: &Path) -> io::Result<Vec<Step>> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    let step = |at: &Path| -> io::Result<Step> {
        let meta = std::fs::symlink_metadata(at)?;
        Ok(Step {
            path: at.to_owned(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
        })
    };
    let mut steps = vec![step(Path::new("/"))?];
    let mut at = PathBuf::from("/");
    let mut rest: VecDeque<Part> = parts(&absolute).collect();
    let mut links = 0;
    while let Some(part) = rest.pop_front() {
        let name = match part {
            Part::Parent => {
                at.pop();
                continue;
            }
            Part::Name(name) => name,
        };
        let here = at.join(&name);
        let reached = step(&here)?;
        let (is_link, is_dir) = (reached.is_link(), reached.is_dir());
        steps.push(reached);
        if is_link {
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::other(format!(
                    "more than {MAX_LINKS} symbolic links on the way to {}",
                    path.display()
                )));
            }
            let target = std::fs::read_link(&here)?;
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            for part in parts(&target).collect::<Vec<_>>().into_iter().rev() {
                rest.push_front(part);
            }
        } else if is_dir {
            at = here;
        } else if !rest.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", here.display()),
            ));
        }
    }
    Ok(steps)
}

/// What `run` and `check` judge: the configuration key, the path it names (`runner.package_dir`
/// and each policy's `env_file`).
pub(crate) fn trusted_paths(config: &Config) -> Vec<(String, Option<String>, PathBuf)> {
    let mut paths = Vec::new();
    if let Some(dir) = &config.runner.package_dir {
        paths.push(("runner.package_dir".to_owned(), None, dir.clone()));
    }
    for (index, policy) in config.policies.iter().enumerate() {
        if let Some(file) = &policy.env_file {
            paths.push((
                format!("policy[{index}].env_file"),
                Some(policy.name.clone()),
                file.clone(),
            ));
        }
    }
    paths
}

/// The runner uid pool for judging ownership: the configured one, or none where it does not
/// resolve (the isolation checks report that).
pub(crate) fn pool_of(config: &Config) -> Pool {
    Pool::resolve(&config.host.runner_uids).unwrap_or_else(|_| Pool::new(Vec::new()))
}

/// Why a job could change `path`, if it could: [`judge`] over its [`trail`]. A path that is not
/// there is not judged (its reader says it is missing); one whose trail cannot be read is
/// refused with the reason.
pub(crate) fn changeable(path: &Path, pool: &Pool) -> Option<String> {
    match trail(path) {
        Ok(trail) => judge(&trail, pool, rustix::process::geteuid().as_raw())
            .map(|untrusted| untrusted.describe()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => Some(format!(
            "cannot tell who may change {}: {e}; check the path",
            path.display()
        )),
    }
}

/// `run`'s refusal (exit 2) of a package source or `env_file` a job could change, naming the
/// key, the path and the fix.
pub(crate) fn refuse_changeable(config: &Config) -> Result<(), Exit> {
    let pool = pool_of(config);
    for (key, _, path) in trusted_paths(config) {
        if let Some(why) = changeable(&path, &pool) {
            return Err(Exit::usage(format!(
                "{}: `{key}`: {}: a job could change what every later runner gets: {why}",
                display_file(config.source.as_deref()),
                path.display()
            )));
        }
    }
    Ok(())
}

/// Which link protections are off, given each setting's value as read (`None`: unreadable),
/// with the fix. Pure: [`protected_links_off`] reads the values.
pub(crate) fn links_unprotected(values: [Option<&str>; 2]) -> Vec<String> {
    PROTECTED_LINKS
        .iter()
        .zip(values)
        .filter_map(|((name, _), value)| match value.map(str::trim) {
            Some(v) if v != "0" && !v.is_empty() => None,
            Some(_) => Some(format!("{name} is 0")),
            None => Some(format!("{name} cannot be read")),
        })
        .collect()
}

/// [`links_unprotected`] of this host's `/proc/sys/fs` settings.
pub(crate) fn protected_links_off() -> Vec<String> {
    let values = PROTECTED_LINKS.map(|(_, file)| std::fs::read_to_string(file).ok());
    links_unprotected([values[0].as_deref(), values[1].as_deref()])
}

/// The fix for link protections that are off, for `check`'s remedy.
pub(crate) const PROTECTED_LINKS_FIX: &str = "run `sysctl -w fs.protected_symlinks=1 fs.protected_hardlinks=1` and keep it across reboots with `printf 'fs.protected_symlinks = 1\\nfs.protected_hardlinks = 1\\n' > /etc/sysctl.d/50-rm-agent.conf` (systemd sets both by default; without them a job can plant a link or a hard link the agent or another user then follows)";

#[cfg(test)]
mod tests;

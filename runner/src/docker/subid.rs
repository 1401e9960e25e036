//! Subordinate id ranges for the runner uids (`/etc/subuid`, `/etc/subgid`): a rootless Docker
//! daemon maps its containers' uids and gids onto the range its uid owns there, through the
//! setuid `newuidmap`/`newgidmap`. rm gives every pool uid a range of its own ([`RANGE_SIZE`]
//! ids, numeric form `UID:START:COUNT`), or checks the one the operator wrote.
//!
//! The rules that keep one job's containers from being another's processes:
//!
//! - a pool uid has **exactly one** entry (rootlesskit maps every entry it finds, and one line
//!   found twice, by name and by number, is the `uid_map` `EINVAL` of rootlesskit 1.1's `auto`
//!   source);
//! - its range holds at least [`RANGE_SIZE`] ids (images use ids up to 65534, `nobody`);
//! - it overlaps **no other entry** of the file (whoever owns it: two uids sharing sub-ids can
//!   signal, trace and write each other's container processes and files) and **no real id** (an
//!   account of `/etc/passwd` or a group of `/etc/group`, and every pool uid: a container process
//!   would *be* that account on the host);
//! - a **new** range covers no id a live user namespace maps (read from `/proc/<pid>/uid_map`
//!   and `gid_map`): a range whose line was removed, or lost to a concurrent writer, while a
//!   daemon still runs on it is never handed out a second time. rm never changes or removes a
//!   line, so a range in use is never taken from its owner either.
//!
//! [`plan`] decides (pure, table tests below): which entry each pool uid keeps, which lines to
//! add, or why it cannot. [`ensure`] is the adapter: it reads the files, plans both, and when
//! lines are missing takes the lock shadow-utils' writers take (`useradd`, `usermod`, `vipw`:
//! glibc's `lckpwdf`, a write lock on `/etc/.pwd.lock`), reads and plans again under it, and
//! appends the new lines atomically (temporary file and rename, the other lines, the owner and
//! the mode kept). A second run finds every entry and writes nothing, and takes no lock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{self, Write as _};
use std::ops::Range;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How many subordinate ids each pool uid gets: the 16-bit id space an image expects (root
/// through `nobody` at 65534).
pub(crate) const RANGE_SIZE: u32 = 65_536;

/// Where new ranges start: far above the ids `useradd` hands out (`SUB_UID_MIN` 100000, one
/// 65536 range per account) and above any ordinary account, so rm's ranges stay out of the way
/// of the host's own. The first free place at or above it is taken.
pub(crate) const ALLOCATION_BASE: u32 = 1_000_000_000;

/// The first id no range may reach: `(uid_t)-1` means "no id" to the kernel's interfaces.
const ID_LIMIT: u64 = u32::MAX as u64;

/// How long [`ensure`] waits for the shadow lock before it gives up: as long as glibc's
/// `lckpwdf` waits (its `TIMEOUT`, 15 s), so rm is as patient with `useradd` as it is with rm.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(15);

/// How often a held shadow lock is tried again while [`ensure`] waits.
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// The host's files. Paths are parameters so tests (and a future chroot) can point elsewhere.
#[derive(Debug, Clone)]
pub struct Files {
    pub passwd: PathBuf,
    pub group: PathBuf,
    pub subuid: PathBuf,
    pub subgid: PathBuf,
    /// The lock every writer of the account files takes (glibc's `lckpwdf`, which shadow-utils
    /// calls before it changes `/etc/subuid`): held while rm reads, plans and renames.
    pub lock: PathBuf,
    /// Where the live processes' user namespace maps are read (`<proc>/<pid>/uid_map`).
    pub proc: PathBuf,
}

impl Files {
    /// The real ones.
    pub fn host() -> Files {
        Files {
            passwd: PathBuf::from("/etc/passwd"),
            group: PathBuf::from("/etc/group"),
            subuid: PathBuf::from("/etc/subuid"),
            subgid: PathBuf::from("/etc/subgid"),
            lock: PathBuf::from("/etc/.pwd.lock"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// One entry of a subordinate id file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// 1-based line number, for messages.
    line: usize,
    /// The name as written: an account name or a numeric uid.
    owner: String,
    /// The uid `owner` stands for, when known (numeric, or a name in `/etc/passwd`).
    uid: Option<u32>,
    ids: Range<u64>,
}

/// A pool uid's subordinate range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubRange {
    pub start: u32,
    pub count: u32,
}

impl SubRange {
    /// The host ids it covers.
    pub(crate) fn ids(&self) -> Range<u64> {
        u64::from(self.start)..u64::from(self.start) + u64::from(self.count)
    }

    pub fn contains(&self, id: u32) -> bool {
        self.ids().contains(&u64::from(id))
    }
}

/// What [`plan`] decided for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every pool uid's range, existing or new.
    pub ranges: BTreeMap<u32, SubRange>,
    /// The lines to append (`UID:START:COUNT`), in pool order; empty when the file is right.
    pub add: Vec<String>,
}

/// Why a pool uid cannot have a range. Each says which line and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error(
        "uid {uid} has {} entries (lines {}); rootlesskit would map each: keep one of them",
        lines.len(),
        join(lines)
    )]
    Several { uid: u32, lines: Vec<usize> },
    #[error(
        "uid {uid}'s entry (line {line}) holds {count} ids; containers need {RANGE_SIZE}: remove the line and rm adds one, or widen it"
    )]
    TooSmall { uid: u32, line: usize, count: u64 },
    #[error(
        "uid {uid}'s entry (line {line}) overlaps {what}: two owners of one id can reach each other's containers; remove the line and rm adds a free range"
    )]
    Overlap { uid: u32, line: usize, what: String },
    #[error(
        "pool uid {uid} lies inside the subordinate range of `{owner}` (line {line}): that account's containers could run as a runner; remove or move that range"
    )]
    PoolInsideRange {
        uid: u32,
        owner: String,
        line: usize,
    },
    #[error(
        "no free range of {RANGE_SIZE} ids is left below {ID_LIMIT} for uid {uid}; remove unused entries"
    )]
    Exhausted { uid: u32 },
}

fn join(lines: &[usize]) -> String {
    lines
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The entries of a subordinate id file: `owner:start:count` lines. Anything else (blank,
/// malformed) is skipped, as shadow's own parser skips it; `names` resolves account names.
fn entries(text: &str, names: &BTreeMap<String, u32>) -> Vec<Entry> {
    text.lines()
        .enumerate()
        .filter_map(|(index, line)| {
            let mut fields = line.trim().split(':');
            let owner = fields.next()?.to_owned();
            let start: u64 = fields.next()?.trim().parse().ok()?;
            let count: u64 = fields.next()?.trim().parse().ok()?;
            if fields.next().is_some() || owner.is_empty() || count == 0 {
                return None;
            }
            let uid = owner.parse().ok().or_else(|| names.get(&owner).copied());
            Some(Entry {
                line: index + 1,
                owner,
                uid,
                ids: start..start.saturating_add(count),
            })
        })
        .collect()
}

/// Account names and their uids from `/etc/passwd` text (or groups and gids from `/etc/group`:
/// the same first and third fields).
pub(crate) fn ids_by_name(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let _password = fields.next()?;
            let id = fields.next()?.parse().ok()?;
            (!name.is_empty()).then(|| (name.to_owned(), id))
        })
        .collect()
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Decides each pool uid's range in one subordinate id file.
///
/// - `file`: the file's text (empty if it does not exist);
/// - `pool`: the runner uids, in the order new ranges are handed out;
/// - `names`: account names to uids (`/etc/passwd`), to know whose a named entry is;
/// - `real`: the ids no range may cover (for `/etc/subuid` the uids of `/etc/passwd`, for
///   `/etc/subgid` the gids of `/etc/group` and the pool's gids). The pool uids are added;
/// - `in_use`: the ids live user namespaces map ([`check`] reads them under `/proc`), which no
///   new range covers.
pub fn plan(
    file: &str,
    pool: &[u32],
    names: &BTreeMap<String, u32>,
    real: &BTreeSet<u32>,
    in_use: &[Range<u64>],
) -> Result<Plan, Vec<Problem>> {
    let entries = entries(file, names);
    let mut reserved: BTreeSet<u32> = real.clone();
    reserved.extend(pool.iter().copied());
    let mut problems = Vec::new();
    let mut ranges = BTreeMap::new();
    let mut wanting = Vec::new();

    for entry in &entries {
        for &uid in pool {
            if entry.ids.contains(&u64::from(uid)) {
                problems.push(Problem::PoolInsideRange {
                    uid,
                    owner: entry.owner.clone(),
                    line: entry.line,
                });
            }
        }
    }
    for &uid in pool {
        let own: Vec<&Entry> = entries.iter().filter(|e| e.uid == Some(uid)).collect();
        let entry = match own.as_slice() {
            [] => {
                wanting.push(uid);
                continue;
            }
            [entry] => *entry,
            several => {
                problems.push(Problem::Several {
                    uid,
                    lines: several.iter().map(|e| e.line).collect(),
                });
                continue;
            }
        };
        let count = entry.ids.end - entry.ids.start;
        if count < u64::from(RANGE_SIZE) {
            problems.push(Problem::TooSmall {
                uid,
                line: entry.line,
                count,
            });
            continue;
        }
        if entry.ids.end > ID_LIMIT {
            problems.push(Problem::Overlap {
                uid,
                line: entry.line,
                what: format!("the invalid id {ID_LIMIT}"),
            });
            continue;
        }
        let other = entries
            .iter()
            .find(|e| e.line != entry.line && overlaps(&e.ids, &entry.ids));
        if let Some(other) = other {
            problems.push(Problem::Overlap {
                uid,
                line: entry.line,
                what: format!("the range of `{}` (line {})", other.owner, other.line),
            });
            continue;
        }
        if let Some(id) = reserved.range(entry.ids.start as u32..).next()
            && u64::from(*id) < entry.ids.end
        {
            problems.push(Problem::Overlap {
                uid,
                line: entry.line,
                what: format!("the real id {id}"),
            });
            continue;
        }
        // The conversions are exact: `end <= ID_LIMIT` was checked above.
        ranges.insert(
            uid,
            SubRange {
                start: entry.ids.start as u32,
                count: (entry.ids.end - entry.ids.start) as u32,
            },
        );
    }

    // New ranges go in the first gap at or above the base that no entry, no range handed out
    // here, no real id and no live namespace's map falls into.
    let mut taken: Vec<Range<u64>> = entries.iter().map(|e| e.ids.clone()).collect();
    taken.extend(reserved.iter().map(|&id| u64::from(id)..u64::from(id) + 1));
    taken.extend(in_use.iter().cloned());
    let mut add = Vec::new();
    for uid in wanting {
        let mut start = u64::from(ALLOCATION_BASE);
        loop {
            let candidate = start..start + u64::from(RANGE_SIZE);
            if candidate.end > ID_LIMIT {
                problems.push(Problem::Exhausted { uid });
                break;
            }
            match taken
                .iter()
                .filter(|t| overlaps(t, &candidate))
                .map(|t| t.end)
                .max()
            {
                Some(end) => start = end,
                None => {
                    let range = SubRange {
                        start: start as u32,
                        count: RANGE_SIZE,
                    };
                    add.push(format!("{uid}:{}:{}", range.start, range.count));
                    ranges.insert(uid, range);
                    taken.push(candidate);
                    break;
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(Plan { ranges, add })
    } else {
        Err(problems)
    }
}

/// Each pool uid's ranges in both files, once they are there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub uids: BTreeMap<u32, SubRange>,
    pub gids: BTreeMap<u32, SubRange>,
    /// How many lines were added (0 on a host already right).
    pub added: usize,
}

/// Why [`ensure`] (or [`check`]) could not give the pool its ranges.
#[derive(Debug, thiserror::Error)]
pub enum SubIdError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "cannot write {path}: {source}; add the lines `rm-agent check` names by hand, or let the agent write /etc (it must be root, and systemd's ProtectSystem=strict keeps /etc read-only)"
    )]
    Write { path: PathBuf, source: io::Error },
    #[error("{path} cannot give every runner uid a range: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused {
        path: PathBuf,
        problems: Vec<Problem>,
    },
    #[error(
        "{path} stayed locked for {}s: another program is changing the account files (useradd, usermod, vipw); rm writes /etc/subuid and /etc/subgid only under that lock, try again when it is done",
        waited.as_secs()
    )]
    Locked { path: PathBuf, waited: Duration },
    #[error(
        "cannot take the lock {path} to write the subordinate id files: {source}; add the lines `rm-agent check` names by hand, or let the agent write /etc (it must be root, and systemd's ProtectSystem=strict keeps /etc read-only)"
    )]
    Lock { path: PathBuf, source: io::Error },
}

/// What [`plan`] says about both files, from their current text.
pub fn check(files: &Files, pool: &[(u32, u32)]) -> Result<(Plan, Plan), SubIdError> {
    let read = |path: &Path| match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(SubIdError::Read {
            path: path.to_owned(),
            source,
        }),
    };
    let passwd = read(&files.passwd)?;
    let group = read(&files.group)?;
    let users = ids_by_name(&passwd);
    let uids: Vec<u32> = pool.iter().map(|&(uid, _)| uid).collect();
    let real_uids: BTreeSet<u32> = users.values().copied().collect();
    // The sub-gid file is keyed by the user too (newgidmap looks the caller's name and uid up);
    // what its ranges must avoid are the real groups, and the pool's own gids.
    let mut real_gids: BTreeSet<u32> = ids_by_name(&group).values().copied().collect();
    real_gids.extend(pool.iter().map(|&(_, gid)| gid));
    let refused = |path: &Path| {
        let path = path.to_owned();
        move |problems| SubIdError::Refused { path, problems }
    };
    let in_use = mapped(&files.proc)?;
    let for_uids = plan(
        &read(&files.subuid)?,
        &uids,
        &users,
        &real_uids,
        &in_use.uids,
    )
    .map_err(refused(&files.subuid))?;
    let for_gids = plan(
        &read(&files.subgid)?,
        &uids,
        &users,
        &real_gids,
        &in_use.gids,
    )
    .map_err(refused(&files.subgid))?;
    Ok((for_uids, for_gids))
}

/// The host ids a `uid_map` or `gid_map` maps (`INSIDE OUTSIDE COUNT` lines, as read from the
/// agent's namespace): `OUTSIDE..OUTSIDE+COUNT` each.
fn map_ranges(text: &str) -> Vec<Range<u64>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _inside: u64 = fields.next()?.parse().ok()?;
            let outside: u64 = fields.next()?.parse().ok()?;
            let count: u64 = fields.next()?.parse().ok()?;
            Some(outside..outside.saturating_add(count))
        })
        .collect()
}

/// The host ids live user namespaces map.
#[derive(Debug, Default, PartialEq, Eq)]
struct InUse {
    uids: Vec<Range<u64>>,
    gids: Vec<Range<u64>>,
}

/// The host uids and gids the live user namespaces other than the agent's own map, from
/// `<proc>/<pid>/{uid_map,gid_map}`: one read per namespace. A process that ends while it is
/// read is skipped (its namespace, if it lives on, has other processes or none to map for).
fn mapped(proc: &Path) -> Result<InUse, SubIdError> {
    let unreadable = |source| SubIdError::Read {
        path: proc.to_owned(),
        source,
    };
    // The agent's own namespace maps every id (the initial one) or the agent's own: not a
    // daemon's range.
    let own = std::fs::read_link(proc.join("self/ns/user")).map_err(unreadable)?;
    let mut seen = BTreeSet::new();
    let mut in_use = InUse::default();
    for entry in std::fs::read_dir(proc).map_err(unreadable)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        let Ok(namespace) = std::fs::read_link(dir.join("ns/user")) else {
            continue;
        };
        if namespace == own || !seen.insert(namespace) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("uid_map")) {
            in_use.uids.extend(map_ranges(&text));
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("gid_map")) {
            in_use.gids.extend(map_ranges(&text));
        }
    }
    Ok(in_use)
}

/// Serialises [`ensure`]'s read, plan and rename within the agent (the shadow lock below
/// excludes the other programs; this keeps the agent's own threads from polling it in turn).
static WRITER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Gives every pool account (`(uid, gid)`) a subordinate uid and gid range: checks the files and
/// appends what is missing, under the shadow lock ([`LOCK_WAIT`] at most). Idempotent.
pub fn ensure(files: &Files, pool: &[(u32, u32)]) -> Result<Assigned, SubIdError> {
    ensure_waiting(files, pool, LOCK_WAIT)
}

/// [`ensure`], waiting `wait` at most for the shadow lock.
fn ensure_waiting(
    files: &Files,
    pool: &[(u32, u32)],
    wait: Duration,
) -> Result<Assigned, SubIdError> {
    let _one_writer = WRITER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (for_uids, for_gids) = check(files, pool)?;
    if for_uids.add.is_empty() && for_gids.add.is_empty() {
        // Nothing to write, no lock: an agent whose /etc is read-only finds its lines there.
        return Ok(Assigned {
            added: 0,
            uids: for_uids.ranges,
            gids: for_gids.ranges,
        });
    }
    // Read and planned again under the lock: a `useradd` that added a range since the read
    // above keeps its line, and its range is not handed out twice.
    let _lock = ShadowLock::take(&files.lock, wait)?;
    let (for_uids, for_gids) = check(files, pool)?;
    append(&files.subuid, &for_uids.add)?;
    append(&files.subgid, &for_gids.add)?;
    Ok(Assigned {
        added: for_uids.add.len() + for_gids.add.len(),
        uids: for_uids.ranges,
        gids: for_gids.ranges,
    })
}

/// The shadow lock, held: a write lock on the whole of `/etc/.pwd.lock`, released when dropped
/// (its descriptor closed).
///
/// glibc's `lckpwdf` takes a classic `fcntl` record lock (owned by the process); this one is an
/// open file description lock (`F_OFD_SETLK`), which conflicts with it in both directions and,
/// unlike a classic one, is neither shared by the agent's other threads nor dropped when another
/// descriptor of the file is closed.
#[derive(Debug)]
struct ShadowLock {
    _file: std::fs::File,
}

impl ShadowLock {
    /// Opens (creating it `0600`, as `lckpwdf` does) and locks `path`, trying again every
    /// [`LOCK_RETRY`] for `wait` at most.
    fn take(path: &Path, wait: Duration) -> Result<ShadowLock, SubIdError> {
        let failed = |source| SubIdError::Lock {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(failed)?;
        let deadline = Instant::now() + wait;
        loop {
            if try_write_lock(&file).map_err(failed)? {
                return Ok(ShadowLock { _file: file });
            }
            if Instant::now() >= deadline {
                return Err(SubIdError::Locked {
                    path: path.to_owned(),
                    waited: wait,
                });
            }
            std::thread::sleep(LOCK_RETRY);
        }
    }
}

/// Tries once to take an open file description write lock on the whole of `file`: `false` when
/// another holds a conflicting lock.
#[allow(unsafe_code)]
fn try_write_lock(file: &std::fs::File) -> io::Result<bool> {
    // SAFETY: `flock` is plain data, valid all zeros (a lock of the whole file, `l_pid` 0 as
    // F_OFD_SETLK requires) before the two fields set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: the descriptor is open for the whole call (borrowed from `file`), and `lock` is a
    // valid `flock` the kernel only reads.
    let done = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if done == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(error),
    }
}

/// Appends `lines` to `path` by writing the whole new file beside it and renaming it over the
/// old one: a reader (newuidmap of a daemon starting meanwhile) sees the old file or the new
/// one, never half a line. Owner and mode are the old file's (0644 root for a new one).
fn append(path: &Path, lines: &[String]) -> Result<(), SubIdError> {
    if lines.is_empty() {
        return Ok(());
    }
    let write_err = |source| SubIdError::Write {
        path: path.to_owned(),
        source,
    };
    let (mut text, mode, owner) = match std::fs::read(path) {
        Ok(text) => {
            let meta = std::fs::metadata(path).map_err(write_err)?;
            (
                text,
                meta.permissions().mode() & 0o7777,
                Some((meta.uid(), meta.gid())),
            )
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), 0o644, None),
        Err(source) => {
            return Err(SubIdError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !text.is_empty() && !text.ends_with(b"\n") {
        text.push(b'\n');
    }
    for line in lines {
        text.extend_from_slice(line.as_bytes());
        text.push(b'\n');
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.rm-{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)?;
        // The mode given at creation passed through the umask: set it exactly.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(write_err)
}

impl fmt::Display for SubRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}..{}",
            self.start,
            u64::from(self.start) + u64::from(self.count)
        )
    }
}

#[cfg(test)]
#[path = "subid_tests.rs"]
mod tests;

//! Action archives kept on the host for runners (`[cache] actions = ["actions/checkout@v4"]`):
//! the rules (which names are accepted, where an archive lives, what is kept, when to refresh)
//! as pure functions, and the store on disk that installs a downloaded archive atomically after
//! checking it. Fetching from GitHub is `rm_github::archives`; the task that refreshes is the
//! agent's.
//!
//! The runner (actions/runner 2.310.0 and later, `ActionManager.DownloadRepositoryActionAsync`)
//! reads `ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE=<dir>` and, before downloading a repository action
//! it resolved to `ResolvedNameWithOwner@ResolvedSha`, copies
//! `<dir>/<owner>_<repo>/<sha>.tar.gz` when it exists (on Windows `<sha>.zip`; rm keeps
//! tarballs only: its runners are Linux). The name is GitHub's resolved one with every `/`
//! made `_`; an action in a sub-folder (`owner/repo/path@ref`) is looked up by its repository,
//! so it shares the repository's archive. The runner copies the file, then unpacks it with
//! `tar -xzf` and requires exactly one top folder, as GitHub's tarballs have.
//!
//! On disk (the store's root, `<cache dir>/actions`): `<owner>_<repo>/` directories `0755` and
//! archives `0644`, written by the agent (root), so runner uids can read and never write them;
//! a download is written to `.tmp-*` beside its final name, synced, checked and renamed, so the
//! runner never sees a partial archive and a crash leaves only a temporary file that the next
//! [`ArchiveStore::open`] removes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io::{self, Read as _};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

/// The store's directory below the cache's directory (`Settings::dir`).
pub const ACTIONS_DIR: &str = "actions";
/// How often each configured ref is resolved again (an unchanged ref is a free `304`), and its
/// archive downloaded when the ref moved. Tags like `v4` move a few times a year; a job that
/// runs between a move and the next refresh downloads from GitHub as without the cache.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60 * 60);
/// The first retry after a failed refresh of an action; it doubles with each failure in a
/// row, up to [`REFRESH_INTERVAL`].
pub const RETRY_FIRST: Duration = Duration::from_secs(60);
/// How long an archive no configured ref names any more is kept: a job that resolved the old
/// commit before the ref moved (its runner downloads actions when it starts the job) still
/// finds it, and a job queued for a while too.
pub const GRACE: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest archive downloaded; a larger one is refused (and runners download it
/// themselves).
pub const MAX_ARCHIVE_BYTES: u64 = 256 * 1024 * 1024;
/// The most bytes an archive may unpack to, by its headers (a gzip bomb is refused).
pub const MAX_UNPACKED_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// The most entries an archive may hold.
pub const MAX_ENTRIES: usize = 200_000;
/// The most actions `[cache] actions` may name.
pub const MAX_ACTIONS: usize = 200;
/// Temporary downloads start with this; the runner never looks such a name up.
const TEMP_PREFIX: &str = ".tmp-";
/// The longest owner (GitHub login), repository and ref accepted.
const MAX_OWNER: usize = 39;
const MAX_REPO: usize = 100;
const MAX_REF: usize = 255;

/// One entry of `[cache] actions`: `owner/repo@ref` or `owner/repo/path@ref`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActionRef {
    pub owner: String,
    pub repo: String,
    /// The action's folder inside the repository, if any: the runner looks up the
    /// repository's archive for it all the same.
    pub path: Option<String>,
    /// A branch, tag or commit SHA.
    pub reference: String,
}

/// Why an `[cache] actions` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not an action rm can keep: write \"owner/repo@ref\" (or \"owner/repo/path@ref\") as in a workflow's `uses:`, with a branch, tag or SHA after `@`; local (`./...`) and `docker://` actions are not archives"
)]
pub struct InvalidAction(pub String);

impl FromStr for ActionRef {
    type Err = InvalidAction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidAction(s.to_owned());
        let (name, reference) = s.split_once('@').ok_or_else(bad)?;
        let mut parts = name.split('/');
        let owner = parts.next().filter(|o| valid_owner(o)).ok_or_else(bad)?;
        let repo = parts.next().filter(|r| valid_repo(r)).ok_or_else(bad)?;
        let rest: Vec<&str> = parts.collect();
        if !rest.iter().all(|p| valid_repo(p)) || !valid_ref(reference) {
            return Err(bad());
        }
        Ok(ActionRef {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            path: (!rest.is_empty()).then(|| rest.join("/")),
            reference: reference.to_owned(),
        })
    }
}

impl fmt::Display for ActionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.repo)?;
        if let Some(path) = &self.path {
            write!(f, "/{path}")?;
        }
        write!(f, "@{}", self.reference)
    }
}

impl ActionRef {
    /// `owner/repo`, as the REST API and the runner's `ResolvedNameWithOwner` name it.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// What the store keeps for this entry once its ref is resolved to `sha`.
    pub fn key(&self, sha: &str) -> ArchiveKey {
        ArchiveKey {
            repository: self.repository(),
            sha: sha.to_owned(),
        }
    }
}

/// A GitHub login: letters, digits and single `-` inside.
fn valid_owner(s: &str) -> bool {
    (1..=MAX_OWNER).contains(&s.len())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// A repository (or folder) name: letters, digits, `-`, `_`, `.`, not `.` or `..`.
fn valid_repo(s: &str) -> bool {
    (1..=MAX_REPO).contains(&s.len())
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A ref as git allows it and a URL path carries it unescaped: names joined by `/`, none
/// empty, none starting with `.` or `-`, no `..`, no `.lock` end.
fn valid_ref(s: &str) -> bool {
    (1..=MAX_REF).contains(&s.len())
        && !s.contains("..")
        && !s.ends_with(".lock")
        && !s.ends_with('.')
        && s.split('/').all(|part| {
            !part.is_empty()
                && !part.starts_with('.')
                && !part.starts_with('-')
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

/// Parses `[cache] actions`, refusing the first bad entry, more than [`MAX_ACTIONS`], and
/// repeats (the same `owner/repo@ref` twice, sub-folders aside, keeps one archive).
pub fn parse_actions(entries: &[String]) -> Result<Vec<ActionRef>, InvalidAction> {
    if entries.len() > MAX_ACTIONS {
        return Err(InvalidAction(format!(
            "{} entries (at most {MAX_ACTIONS})",
            entries.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for entry in entries {
        let action: ActionRef = entry.parse()?;
        if seen.insert((action.repository(), action.reference.clone())) {
            out.push(action);
        }
    }
    Ok(out)
}

/// One archive: a repository's commit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ArchiveKey {
    /// `owner/repo`.
    pub repository: String,
    pub sha: String,
}

/// The directory of `repository`'s archives: its name with `/` made `_`, as the runner makes
/// it (GitHub logins hold no `_`, so the first `_` splits it back).
pub fn repository_dir(repository: &str) -> String {
    repository.replace(['/', '\\'], "_")
}

/// Where the runner looks for `key` below the store's root: `<owner>_<repo>/<sha>.tar.gz`.
pub fn archive_path(root: &Path, key: &ArchiveKey) -> PathBuf {
    root.join(repository_dir(&key.repository))
        .join(format!("{}.tar.gz", key.sha))
}

/// The key of a stored file (`<owner>_<repo>` directory, `<sha>.tar.gz` name), or `None` for
/// a name rm does not write.
pub fn key_of(dir: &str, file: &str) -> Option<ArchiveKey> {
    let (owner, repo) = dir.split_once('_')?;
    let sha = file.strip_suffix(".tar.gz")?;
    (valid_owner(owner) && valid_repo(repo) && is_sha(sha)).then(|| ArchiveKey {
        repository: format!("{owner}/{repo}"),
        sha: sha.to_owned(),
    })
}

/// A commit SHA as GitHub writes it: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits.
pub fn is_sha(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Which stored archives to remove now. `wanted` are the current commits of the configured
/// refs; `unwanted_since` remembers when each stored archive was first seen not wanted (kept
/// up to date here: a wanted one is forgotten, a new unwanted one starts its grace at `now`).
/// An archive goes once it has been unwanted for [`GRACE`]: the previous commit of a ref that
/// moved stays for that long, everything else (a ref removed from the configuration, an
/// archive from before a restart) goes after the same grace.
pub fn to_remove(
    stored: &BTreeSet<ArchiveKey>,
    wanted: &BTreeSet<ArchiveKey>,
    unwanted_since: &mut BTreeMap<ArchiveKey, SystemTime>,
    now: SystemTime,
) -> Vec<ArchiveKey> {
    unwanted_since.retain(|key, _| stored.contains(key) && !wanted.contains(key));
    let mut out = Vec::new();
    for key in stored.difference(wanted) {
        let since = *unwanted_since.entry(key.clone()).or_insert(now);
        // A clock that went back restarts nothing and removes nothing early.
        if now.duration_since(since).is_ok_and(|d| d >= GRACE) {
            out.push(key.clone());
        }
    }
    out
}

/// When to refresh an action again after `failures` failures in a row (0: the last refresh
/// succeeded): [`REFRESH_INTERVAL`] after a success, else [`RETRY_FIRST`] doubled per further
/// failure, never longer than the interval; and never before `not_before` (GitHub's rate-limit
/// reset, when that was the failure).
pub fn next_refresh(failures: u32, not_before: Option<Duration>) -> Duration {
    let base = if failures == 0 {
        REFRESH_INTERVAL
    } else {
        let doubled = RETRY_FIRST.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)));
        doubled.min(REFRESH_INTERVAL)
    };
    not_before.map_or(base, |wait| base.max(wait))
}

/// Why a downloaded archive was not installed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a gzip file (it starts {0:?}): GitHub sent something else, e.g. an error page")]
    NotGzip(String),
    #[error("not a tar archive GitHub would make: {0}")]
    NotTar(String),
    #[error("{0} top-level entries; GitHub's archives have exactly one folder")]
    TopFolders(usize),
    #[error("entry {0:?} is outside the archive's folder")]
    Escapes(String),
    #[error("the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes or {MAX_ENTRIES} entries")]
    TooLarge,
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Checks that `reader` is a gzip tar as GitHub makes a commit's: every entry (extended and
/// global headers aside) inside one top folder, no absolute path, no `..`, within
/// [`MAX_UNPACKED_BYTES`] and [`MAX_ENTRIES`]. Returns the folder's name.
pub fn check_archive(mut reader: impl io::Read) -> Result<String, ArchiveError> {
    let mut magic = [0u8; 2];
    let got =
        read_up_to(&mut reader, &mut magic).map_err(|e| ArchiveError::NotTar(e.to_string()))?;
    if got < 2 || magic != [0x1f, 0x8b] {
        return Err(ArchiveError::NotGzip(
            String::from_utf8_lossy(&magic[..got]).into_owned(),
        ));
    }
    let gz = flate2::read::GzDecoder::new((&magic[..]).chain(reader));
    let mut archive = tar::Archive::new(gz);
    let entries = archive
        .entries()
        .map_err(|e| ArchiveError::NotTar(e.to_string()))?;
    let mut tops = BTreeSet::new();
    let mut count = 0usize;
    let mut unpacked = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| ArchiveError::NotTar(e.to_string()))?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            continue;
        }
        count += 1;
        unpacked = unpacked.saturating_add(entry.header().size().unwrap_or(u64::MAX));
        if count > MAX_ENTRIES || unpacked > MAX_UNPACKED_BYTES {
            return Err(ArchiveError::TooLarge);
        }
        let path = entry
            .path()
            .map_err(|e| ArchiveError::NotTar(e.to_string()))?
            .into_owned();
        let shown = path.display().to_string();
        let mut components = path.components();
        let top = match components.next() {
            Some(Component::Normal(top)) => top.to_string_lossy().into_owned(),
            _ => return Err(ArchiveError::Escapes(shown)),
        };
        if components.any(|c| !matches!(c, Component::Normal(_))) {
            return Err(ArchiveError::Escapes(shown));
        }
        // A file at the top is a second top-level entry, as a second folder is.
        let is_top_file = path.components().count() == 1 && !kind.is_dir();
        tops.insert((top, is_top_file));
    }
    match tops.len() {
        1 => match tops.into_iter().next() {
            Some((top, false)) => Ok(top),
            _ => Err(ArchiveError::TopFolders(1)),
        },
        n => Err(ArchiveError::TopFolders(n)),
    }
}

fn read_up_to(reader: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The archives on disk, below `root` (`<cache dir>/actions`).
#[derive(Debug, Clone)]
pub struct ArchiveStore {
    root: PathBuf,
}

/// A download in progress: a temporary file beside where the archive will be.
#[derive(Debug)]
pub struct Staged {
    key: ArchiveKey,
    temp: PathBuf,
    file: fs::File,
}

impl Staged {
    /// The file to write the download into (positioned at its start).
    pub fn writer(&self) -> io::Result<tokio::fs::File> {
        Ok(tokio::fs::File::from_std(self.file.try_clone()?))
    }

    pub fn key(&self) -> &ArchiveKey {
        &self.key
    }

    /// Where the download is being written.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }
}

impl ArchiveStore {
    /// Opens (creating, `0755`) the store at `root` and removes every temporary file a crash
    /// left (no download runs before the store is opened).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ArchiveError> {
        let store = ArchiveStore { root: root.into() };
        make_dir(&store.root)?;
        store.sweep_temporaries()?;
        Ok(store)
    }

    /// The directory runners are given as `ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether `key`'s archive is installed.
    pub fn contains(&self, key: &ArchiveKey) -> bool {
        archive_path(&self.root, key).is_file()
    }

    /// Starts a download of `key`: a new temporary file (`0644`) in its repository's directory
    /// (`0755`), so the final rename stays in one directory.
    pub fn begin(&self, key: &ArchiveKey) -> Result<Staged, ArchiveError> {
        let dir = self.root.join(repository_dir(&key.repository));
        make_dir(&dir)?;
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| ArchiveError::Io {
            path: dir.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        let temp = dir.join(format!("{TEMP_PREFIX}{}-{}", key.sha, hex::encode(nonce)));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(io_at(&temp))?;
        file.set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(io_at(&temp))?;
        Ok(Staged {
            key: key.clone(),
            temp,
            file,
        })
    }

    /// Checks the downloaded archive ([`check_archive`]), syncs it and renames it into place;
    /// the temporary file is removed when it is refused. Blocking (it reads the whole archive):
    /// call it off the async threads.
    pub fn install(&self, staged: Staged) -> Result<PathBuf, ArchiveError> {
        let result = self.finish(&staged);
        if result.is_err() {
            let _ = fs::remove_file(&staged.temp);
        }
        result
    }

    /// Gives a failed download up: its temporary file is removed.
    pub fn abandon(&self, staged: Staged) {
        // Already gone is fine; any other failure leaves it to the next `open`'s sweep.
        let _ = fs::remove_file(&staged.temp);
    }

    fn finish(&self, staged: &Staged) -> Result<PathBuf, ArchiveError> {
        let temp = &staged.temp;
        staged.file.sync_all().map_err(io_at(temp))?;
        let reader = fs::File::open(temp).map_err(io_at(temp))?;
        check_archive(io::BufReader::new(reader))?;
        let target = archive_path(&self.root, &staged.key);
        fs::rename(temp, &target).map_err(io_at(&target))?;
        if let Some(dir) = target.parent() {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_at(dir))?;
        }
        Ok(target)
    }

    /// Every archive installed.
    pub fn stored(&self) -> Result<BTreeSet<ArchiveKey>, ArchiveError> {
        let mut out = BTreeSet::new();
        for (dir_name, dir) in self.repository_dirs()? {
            for entry in fs::read_dir(&dir).map_err(io_at(&dir))? {
                let entry = entry.map_err(io_at(&dir))?;
                if let Some(key) = key_of(&dir_name, &entry.file_name().to_string_lossy()) {
                    out.insert(key);
                }
            }
        }
        Ok(out)
    }

    /// Removes `key`'s archive, and its repository's directory once empty.
    pub fn remove(&self, key: &ArchiveKey) -> Result<(), ArchiveError> {
        let path = archive_path(&self.root, key);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&path)(e)),
        }
        if let Some(dir) = path.parent() {
            // Not empty (another archive) or already gone: both fine.
            let _ = fs::remove_dir(dir);
        }
        Ok(())
    }

    /// Bytes of every installed archive, for `status` and `/metrics`.
    pub fn bytes(&self) -> Result<u64, ArchiveError> {
        let mut total = 0u64;
        for key in self.stored()? {
            let path = archive_path(&self.root, &key);
            total += fs::metadata(&path).map_err(io_at(&path))?.len();
        }
        Ok(total)
    }

    /// Removes every temporary file; returns how many.
    fn sweep_temporaries(&self) -> Result<usize, ArchiveError> {
        let mut removed = 0;
        for (_, dir) in self.repository_dirs()? {
            for entry in fs::read_dir(&dir).map_err(io_at(&dir))? {
                let entry = entry.map_err(io_at(&dir))?;
                if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    let path = entry.path();
                    fs::remove_file(&path).map_err(io_at(&path))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// The `<owner>_<repo>` directories (anything else in the root is not rm's and is left).
    fn repository_dirs(&self) -> Result<Vec<(String, PathBuf)>, ArchiveError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(io_at(&self.root))? {
            let entry = entry.map_err(io_at(&self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type().map_err(io_at(&entry.path()))?.is_dir();
            let ours = name
                .split_once('_')
                .is_some_and(|(o, r)| valid_owner(o) && valid_repo(r));
            if is_dir && ours {
                out.push((name, entry.path()));
            }
        }
        Ok(out)
    }
}

/// Creates `dir` (and its parents) `0755` and sets it `0755` if it was there with other bits:
/// runners read through it, nobody but the agent writes.
fn make_dir(dir: &Path) -> Result<(), ArchiveError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(io_at(dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(io_at(dir))
}

#[cfg(test)]
mod tests;

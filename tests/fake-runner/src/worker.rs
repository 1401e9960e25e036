//! The fake runner's worker: what actions/runner's `Runner.Worker` does with a job, as far as a
//! runner manager's cache can see it.
//!
//! - **Set up job**: each action the job uses (`owner/repo@sha`) is taken, as the real worker's
//!   `ActionManager` does, from `$ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE/<owner>_<repo>/<sha>.tar.gz`
//!   when that variable names a directory holding it, else downloaded from
//!   `GET /repos/{owner}/{repo}/tarball/{sha}` with the job's token, following the redirect to
//!   codeload, and unpacked (the archive's one top directory) into
//!   `_work/_actions/<owner>/<repo>/<sha>`. How long it took is written to
//!   `_diag/`[`SETUP_DONE_FILE`]. (The real worker sends the token as `Basic`
//!   `x-access-token:<token>`; the fake GitHub reads `token`/`Bearer` credentials only, so the
//!   fake worker sends `token <token>`: the same credential, another scheme.)
//! - **What a node action's step is given** ([`step_env`]): the job's identity ([`identity_env`])
//!   and what the handler sets by literals of its own, among them `ACTIONS_RESULTS_URL` and
//!   `ACTIONS_CACHE_URL` from the job message (the results service), exactly for the names the
//!   package's `bin/Runner.Worker.dll` holds as UTF-16 strings: a package whose literals were
//!   renamed (`ACTIONS_RESULTS_ORL`) sets neither, and the step keeps the value it has from the
//!   job's dictionary or the runner's environment (a local cache).
//! - **The steps** after Set up job (the job-started hook, `$GITHUB_ENV`, the step on the host
//!   `bin/`[`STEP_SCRIPT`], the step in a container) are [`crate::steps`]'.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rm_fake_github::jit::AssignedJob;

/// The variable naming the host's directory of action archives (actions/runner PR #2857).
pub const ARCHIVE_CACHE_ENV: &str = "ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE";
/// Written in the runtime's `_diag` once "Set up job" is done:
/// `<n> actions from <host|download|host+download|none> in <ms> ms`.
pub const SETUP_DONE_FILE: &str = "setup.done";
/// The job's step, in the package's `bin/`: run with `sh` when present.
pub const STEP_SCRIPT: &str = "step.sh";
/// The worker assembly whose string literals name the variables the worker sets.
pub const WORKER_DLL: &str = "Runner.Worker.dll";
/// The variables the real worker sets for a node action's step from the job message's results
/// service, by literals of its own (`ACTIONS_RESULTS_URL` from `ResultsServiceUrl`,
/// `ACTIONS_CACHE_URL` from `CacheServerUrl`).
pub const REDIRECTABLE: [&str; 2] = ["ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL"];
/// What `GITHUB_SERVER_URL` is: github.com, so `@actions/cache` does not take the server for
/// GHES (where it would speak cache v1 only).
const SERVER_URL: &str = "https://github.com";
/// The most redirects an archive download follows (GitHub answers the tarball with one, to
/// codeload).
const MAX_REDIRECTS: usize = 5;
/// The largest action archive downloaded.
const MAX_ARCHIVE_BYTES: usize = 256 << 20;
/// How long one archive download may take.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// An action a job uses: `owner/repo@sha`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ActionRef {
    pub(crate) owner: String,
    pub(crate) repo: String,
    pub(crate) sha: String,
}

impl ActionRef {
    /// `owner/repo@sha`, each part a plain name (no path separator, no `..`).
    pub(crate) fn parse(uses: &str) -> Option<ActionRef> {
        let (name, sha) = uses.split_once('@')?;
        let (owner, repo) = name.split_once('/')?;
        let plain = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        (plain(owner) && plain(repo) && plain(sha)).then(|| ActionRef {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            sha: sha.to_owned(),
        })
    }

    /// Where the host's archive of it is: `<dir>/<owner>_<repo>/<sha>.tar.gz`.
    pub(crate) fn archive_in(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}_{}", self.owner, self.repo))
            .join(format!("{}.tar.gz", self.sha))
    }

    /// Where the worker unpacks it: `_work/_actions/<owner>/<repo>/<sha>`.
    pub(crate) fn unpacked_in(&self, work: &Path) -> PathBuf {
        work.join("_actions")
            .join(&self.owner)
            .join(&self.repo)
            .join(&self.sha)
    }
}

/// Where "Set up job" took an action from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Host,
    Download,
}

/// The `<host|download|...>` of [`SETUP_DONE_FILE`]: where the actions came from.
pub(crate) fn sources_word(sources: &[Source]) -> &'static str {
    let host = sources.contains(&Source::Host);
    let download = sources.contains(&Source::Download);
    match (host, download) {
        (false, false) => "none",
        (true, false) => "host",
        (false, true) => "download",
        (true, true) => "host+download",
    }
}

/// `name` as UTF-16LE bytes, as .NET keeps a string literal.
pub(crate) fn utf16le(name: &str) -> Vec<u8> {
    name.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// Which of [`REDIRECTABLE`] the worker assembly `dll` holds as a UTF-16LE string: the
/// variables this worker sets from the job message.
pub(crate) fn names_in_worker(dll: &[u8]) -> Vec<&'static str> {
    REDIRECTABLE
        .into_iter()
        .filter(|name| {
            let needle = utf16le(name);
            dll.windows(needle.len()).any(|w| w == needle.as_slice())
        })
        .collect()
}

/// Where a job's step runs and writes.
pub(crate) struct StepDirs {
    /// `GITHUB_WORKSPACE`: `_work/<repo>/<repo>`.
    pub(crate) workspace: PathBuf,
    /// `RUNNER_TEMP`: `_work/_temp`.
    pub(crate) temp: PathBuf,
}

/// The job's identity as the worker gives it to every step, the job-started hook's included
/// (the `github` context's variables and the job's folders).
pub(crate) fn identity_env(job: &AssignedJob, dirs: &StepDirs) -> Vec<(String, String)> {
    [
        ("GITHUB_ACTIONS", "true".to_owned()),
        ("CI", "true".to_owned()),
        ("GITHUB_REPOSITORY", job.repository.clone()),
        ("GITHUB_REF", job.git_ref.clone()),
        ("GITHUB_SHA", job.sha.clone()),
        ("GITHUB_EVENT_NAME", job.event.clone()),
        ("GITHUB_JOB", job.name.clone()),
        ("GITHUB_RUN_ID", job.run_id.to_string()),
        ("GITHUB_SERVER_URL", SERVER_URL.to_owned()),
        ("GITHUB_WORKSPACE", dirs.workspace.display().to_string()),
        ("RUNNER_TEMP", dirs.temp.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// What the worker's handler sets for a node (or container) action's step of `job`, over the
/// job's dictionary: its identity, the runtime token, and the results service from the job
/// message for the names of `worker_names` ([`names_in_worker`]).
pub(crate) fn step_env(
    job: &AssignedJob,
    dirs: &StepDirs,
    worker_names: &[&str],
) -> Vec<(String, String)> {
    let mut env = identity_env(job, dirs);
    env.extend(
        [
            ("ACTIONS_RUNTIME_TOKEN", job.runtime_token.clone()),
            ("ACTIONS_CACHE_SERVICE_V2", "true".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    for name in REDIRECTABLE {
        if worker_names.contains(&name) {
            env.push((name.to_owned(), job.results_url.clone()));
        }
    }
    env
}

/// "Set up job": every action of `job` unpacked into `work`, from the host's archives where
/// `archive_cache` holds them, else downloaded from `server_url`; where each came from.
pub(crate) async fn set_up_job(
    job: &AssignedJob,
    server_url: &str,
    archive_cache: Option<&Path>,
    work: &Path,
) -> anyhow::Result<Vec<(String, Source)>> {
    let mut done = Vec::new();
    for uses in &job.uses {
        let action =
            ActionRef::parse(uses).with_context(|| format!("{uses:?} is not owner/repo@sha"))?;
        let on_host = archive_cache
            .map(|dir| action.archive_in(dir))
            .filter(|p| p.is_file());
        let (archive, source) = match on_host {
            Some(path) => (
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?,
                Source::Host,
            ),
            None => (
                download(server_url, &action, &job.github_token).await?,
                Source::Download,
            ),
        };
        let dest = action.unpacked_in(work);
        tokio::task::spawn_blocking(move || unpack(&archive, &dest))
            .await?
            .with_context(|| format!("cannot unpack {uses}"))?;
        done.push((uses.clone(), source));
    }
    Ok(done)
}

/// The archive of `action` from the fake's tarball endpoint, following its redirect.
async fn download(server_url: &str, action: &ActionRef, token: &str) -> anyhow::Result<Vec<u8>> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut url = format!(
        "{}/repos/{}/{}/tarball/{}",
        server_url.trim_end_matches('/'),
        action.owner,
        action.repo,
        action.sha
    );
    let origin = server_url.trim_end_matches('/').to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let mut request = http::Request::get(url.as_str())
            .header(http::header::USER_AGENT, "GitHubActionsRunner-fake/2.300.0");
        // The credential goes to the server it was made for, not to the redirect's host.
        if url.starts_with(&origin) && !token.is_empty() {
            request = request.header(http::header::AUTHORIZATION, format!("token {token}"));
        }
        let answer = tokio::time::timeout(
            DOWNLOAD_TIMEOUT,
            client.request(request.body(Empty::new())?),
        )
        .await
        .context("the archive download timed out")?
        .with_context(|| format!("cannot download {}/{}", action.owner, action.repo))?;
        let status = answer.status();
        if status.is_redirection() {
            let location = answer
                .headers()
                .get(http::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .context("a redirect without a location")?;
            url = if location.starts_with('/') {
                format!("{origin}{location}")
            } else {
                location.to_owned()
            };
            continue;
        }
        if !status.is_success() {
            bail!(
                "the tarball of {}/{}@{} answered {status}",
                action.owner,
                action.repo,
                action.sha
            );
        }
        let body = http_body_util::Limited::new(answer.into_body(), MAX_ARCHIVE_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the archive: {e}"))?;
        return Ok(body.to_bytes().to_vec());
    }
    bail!(
        "more than {MAX_REDIRECTS} redirects for {}/{}",
        action.owner,
        action.repo
    )
}

/// Unpacks a `.tar.gz` as GitHub's tarballs are (one top directory, `owner-repo-sha/`) into
/// `dest`: the top directory's contents become `dest`'s, as the worker moves them.
fn unpack(archive: &[u8], dest: &Path) -> anyhow::Result<()> {
    let parent = dest.parent().context("no parent")?;
    std::fs::create_dir_all(parent)?;
    let staging = parent.join(format!(
        "_staging_{}",
        dest.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    // `unpack` keeps every entry inside `staging` (no `..`, no absolute path).
    tar::Archive::new(flate2::read::GzDecoder::new(archive)).unpack(&staging)?;
    let dirs: Vec<PathBuf> = std::fs::read_dir(&staging)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    let [top] = dirs.as_slice() else {
        bail!("the archive holds {} top directories, not one", dirs.len());
    };
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(top, dest)?;
    std::fs::remove_dir_all(&staging)?;
    Ok(())
}

/// The result of "Set up job" in [`SETUP_DONE_FILE`]'s words.
pub(crate) fn setup_line(sources: &[Source], took: Duration) -> String {
    format!(
        "{} actions from {} in {} ms\n",
        sources.len(),
        sources_word(sources),
        took.as_millis()
    )
}

/// Runs "Set up job" for `job` and writes [`SETUP_DONE_FILE`] in `diag`; the log's lines.
pub(crate) async fn timed_set_up(
    job: &AssignedJob,
    server_url: &str,
    work: &Path,
    diag: &Path,
) -> anyhow::Result<Vec<String>> {
    let started = Instant::now();
    let cache = std::env::var_os(ARCHIVE_CACHE_ENV).map(PathBuf::from);
    let done = set_up_job(job, server_url, cache.as_deref(), work).await?;
    let took = started.elapsed();
    let sources: Vec<Source> = done.iter().map(|(_, s)| *s).collect();
    std::fs::write(diag.join(SETUP_DONE_FILE), setup_line(&sources, took))?;
    Ok(done
        .iter()
        .map(|(uses, source)| {
            let from = match source {
                Source::Host => "from the host's archive",
                Source::Download => "downloaded",
            };
            format!("Set up job: {uses} {from}")
        })
        .collect())
}

/// The package's step and worker assembly, beside the running `Runner.Listener`.
pub(crate) struct Package {
    pub(crate) bin: PathBuf,
}

impl Package {
    /// The `bin/` of the running executable.
    pub(crate) fn running() -> anyhow::Result<Package> {
        let exe = std::env::current_exe()?;
        let bin = exe.parent().context("the executable has no directory")?;
        Ok(Package {
            bin: bin.to_path_buf(),
        })
    }

    pub(crate) fn step(&self) -> Option<PathBuf> {
        Some(self.bin.join(STEP_SCRIPT)).filter(|p| p.is_file())
    }

    /// The variables the package's worker sets from the job message: none without its dll.
    pub(crate) fn worker_names(&self) -> Vec<&'static str> {
        std::fs::read(self.bin.join(WORKER_DLL))
            .map(|dll| names_in_worker(&dll))
            .unwrap_or_default()
    }
}

/// A synthetic `Runner.Worker.dll`: filler bytes with each of `names` as an entry of a .NET
/// user-string heap (`#US`: a length byte `2 * chars + 1`, the UTF-16LE characters, a `0x00`
/// flag byte), amid other literals of the worker. What a package derivation that renames the
/// literals meets in the real assembly, in a few KiB.
pub fn synthetic_worker_dll(names: &[&str]) -> Vec<u8> {
    // Deterministic filler (xorshift), with the PE's first bytes.
    let mut dll = b"MZ\x90\x00\x03\x00\x00\x00".to_vec();
    let mut x: u32 = 0x2545_f491;
    let mut filler = |dll: &mut Vec<u8>, n: usize| {
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            dll.push(x.to_le_bytes()[0]);
        }
    };
    let others = [
        "ACTIONS_RUNTIME_URL",
        "ACTIONS_RUNTIME_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "GITHUB_ACTIONS",
    ];
    filler(&mut dll, 4096);
    let user_string = |dll: &mut Vec<u8>, s: &str| {
        let chars = s.encode_utf16().count();
        // Names here are short: one length byte (below 0x80) is the heap's compressed form.
        dll.push(u8::try_from(2 * chars + 1).unwrap_or(0x7f));
        dll.extend(utf16le(s));
        dll.push(0);
    };
    for (i, name) in names.iter().enumerate() {
        user_string(&mut dll, others[i % others.len()]);
        user_string(&mut dll, name);
        filler(&mut dll, 1024);
    }
    user_string(&mut dll, others[others.len() - 1]);
    filler(&mut dll, 2048);
    dll
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_is_owner_repo_at_sha_of_plain_names() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            ActionRef::parse(&format!("actions/checkout@{sha}")),
            Some(ActionRef {
                owner: "actions".into(),
                repo: "checkout".into(),
                sha: sha.into()
            })
        );
        for bad in [
            "actions/checkout",
            "checkout@abc",
            "../x@abc",
            "a/../b@c",
            "a/b@../c",
            "a/b/c@d",
            "/b@c",
        ] {
            assert_eq!(ActionRef::parse(bad), None, "{bad}");
        }
        let a = ActionRef::parse("actions/cache@abc").unwrap_or_else(|| unreachable!());
        assert_eq!(
            a.archive_in(Path::new("/c")),
            Path::new("/c/actions_cache/abc.tar.gz")
        );
        assert_eq!(
            a.unpacked_in(Path::new("/w")),
            Path::new("/w/_actions/actions/cache/abc")
        );
    }

    #[test]
    fn the_worker_sets_exactly_the_names_its_assembly_holds() {
        for (names, found) in [
            (&REDIRECTABLE[..], &REDIRECTABLE[..]),
            (&["ACTIONS_RESULTS_URL"][..], &["ACTIONS_RESULTS_URL"][..]),
            (&["ACTIONS_RESULTS_ORL", "ACTIONS_CACHE_ORL"][..], &[][..]),
            (&[][..], &[][..]),
        ] {
            assert_eq!(
                names_in_worker(&synthetic_worker_dll(names)),
                found,
                "{names:?}"
            );
        }
        // ASCII is not what .NET keeps: a name in ASCII alone is not the worker's literal.
        assert!(names_in_worker(b"xxACTIONS_RESULTS_URLxx").is_empty());
    }

    #[test]
    fn a_synthetic_worker_holds_each_name_once_as_a_user_string() {
        let dll = synthetic_worker_dll(&REDIRECTABLE);
        for name in REDIRECTABLE {
            let mut entry = vec![u8::try_from(2 * name.len() + 1).unwrap_or(0)];
            entry.extend(utf16le(name));
            entry.push(0);
            let count = dll
                .windows(entry.len())
                .filter(|w| *w == entry.as_slice())
                .count();
            assert_eq!(count, 1, "{name}");
        }
    }

    #[test]
    fn a_step_gets_the_job_s_identity_and_the_results_url_only_where_the_worker_sets_it() {
        let job = AssignedJob {
            job_id: 7,
            run_id: 9,
            name: "save".into(),
            repository: "acme/widgets".into(),
            git_ref: "refs/heads/main".into(),
            sha: "abc".into(),
            event: "push".into(),
            results_url: "http://127.0.0.1:1/".into(),
            runtime_token: "a.b.c".into(),
            ..AssignedJob::default()
        };
        let dirs = StepDirs {
            workspace: PathBuf::from("/w/widgets/widgets"),
            temp: PathBuf::from("/w/_temp"),
        };
        let get = |env: &[(String, String)], k: &str| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        };
        let all = step_env(&job, &dirs, &REDIRECTABLE);
        for (k, v) in [
            ("GITHUB_REPOSITORY", "acme/widgets"),
            ("GITHUB_REF", "refs/heads/main"),
            ("GITHUB_SERVER_URL", "https://github.com"),
            ("GITHUB_WORKSPACE", "/w/widgets/widgets"),
            ("RUNNER_TEMP", "/w/_temp"),
            ("ACTIONS_RUNTIME_TOKEN", "a.b.c"),
            ("ACTIONS_CACHE_SERVICE_V2", "true"),
            ("ACTIONS_RESULTS_URL", "http://127.0.0.1:1/"),
            ("ACTIONS_CACHE_URL", "http://127.0.0.1:1/"),
        ] {
            assert_eq!(get(&all, k).as_deref(), Some(v), "{k}");
        }
        let patched = step_env(&job, &dirs, &[]);
        for name in REDIRECTABLE {
            assert_eq!(
                get(&patched, name),
                None,
                "{name} left to the runner's environment"
            );
        }
    }

    #[test]
    fn setup_says_where_the_actions_came_from() {
        let ms = Duration::from_millis(12);
        assert_eq!(setup_line(&[], ms), "0 actions from none in 12 ms\n");
        assert_eq!(
            setup_line(&[Source::Host, Source::Host], ms),
            "2 actions from host in 12 ms\n"
        );
        assert_eq!(
            setup_line(&[Source::Download], ms),
            "1 actions from download in 12 ms\n"
        );
        assert_eq!(
            setup_line(&[Source::Host, Source::Download], ms),
            "2 actions from host+download in 12 ms\n"
        );
    }

    #[test]
    fn an_archive_s_top_directory_becomes_the_action_s_directory() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let src = dir.path().join("src/actions-cache-abc1234");
        std::fs::create_dir_all(src.join("dist")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("action.yml"), "name: cache\n").unwrap_or_else(|e| panic!("{e}"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        {
            let mut tar = tar::Builder::new(&mut gz);
            tar.append_dir_all("actions-cache-abc1234", &src)
                .unwrap_or_else(|e| panic!("{e}"));
            tar.finish().unwrap_or_else(|e| panic!("{e}"));
        }
        let archive = gz.finish().unwrap_or_else(|e| panic!("{e}"));
        let dest = dir.path().join("_work/_actions/actions/cache/abc");
        unpack(&archive, &dest).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(dest.join("action.yml").is_file());
        assert!(dest.join("dist").is_dir());
        // Unpacking again (a retried job) replaces it.
        unpack(&archive, &dest).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            std::fs::read_dir(dest.parent().unwrap_or(&dest))
                .map(|d| d.count())
                .unwrap_or(0),
            1,
            "no staging directory left"
        );
    }
}

//! The fake worker's steps after "Set up job", and the job's environment dictionary they share,
//! as actions/runner's `Runner.Worker` builds them (file and class names are actions/runner's).
//!
//! - **The job-started hook** (`ACTIONS_RUNNER_HOOK_JOB_STARTED`, `JobExtension` and
//!   `JobHookProvider`): when the worker's environment names one, it runs before the job's
//!   first step, on the runner's host, as a script step: `bash --noprofile --norc -e -o pipefail
//!   <hook>` where `bash` is on the `PATH`, else `sh -e <hook>` (`GetDefaultShellForScript`,
//!   `ScriptHandlerHelpers`; only a `.sh` hook is run, the real one also takes `.ps1` and
//!   `.js`). Its environment is the worker's own, the job's identity (`GITHUB_*`) and a fresh
//!   `$GITHUB_ENV`, none of the job's dictionary (the hook's handler is given an empty one). A
//!   hook that is missing, is not a `.sh`, exits non-zero or leaves a malformed `$GITHUB_ENV`
//!   fails the job, and no step runs. The job-completed hook (`ACTIONS_RUNNER_HOOK_JOB_COMPLETED`)
//!   runs the same way after the job's last step; its output goes to the job's log, and its
//!   failure fails the job.
//! - **`$GITHUB_ENV`** (`FileCommandManager`, `SetEnvFileCommand`): each step the worker runs
//!   on the host gets a fresh, empty file; once the step is done its `NAME=value` lines and
//!   `NAME<<DELIM` heredocs ([`parse_env_file`], `EnvFileKeyValuePairs`'s reading, malformed
//!   lines refused with its words) are added to the job's dictionary ([`JobEnv`]), so every
//!   later step has them. `NODE_OPTIONS` is not taken (the runner's block list).
//! - **A host step** (`bin/`[`crate::worker::STEP_SCRIPT`], a node action's step): its process
//!   gets the worker's environment, then the job's dictionary, then what the node handler sets
//!   (`crate::worker::step_env`: the job's identity, `ACTIONS_RUNTIME_TOKEN`, and the
//!   redirectable names the worker assembly holds, from the job message), each over the one
//!   before ([`step_dictionary`]: `Environment[...] = ...` in the handler overwrites the job's
//!   value of the same name).
//! - **A container step** (`bin/`[`CONTAINER_STEP_SCRIPT`], a Docker container action's step,
//!   where `DOCKER_HOST` is set; without it the job fails): `docker run --rm -e NAME ... <image>
//!   sh -c <script>` with the image `bin/`[`CONTAINER_IMAGE_FILE`] names
//!   (`DockerCommandManager.DockerRun`). The `-e` names are exactly the step's dictionary's (the
//!   job's dictionary and what the handler sets), never the worker's whole environment; docker
//!   takes their values from its own environment, which is the worker's with the dictionary
//!   over it. So a variable only the worker's environment holds does not reach the container,
//!   however the host steps see it. Its stdout is appended to `<job>.container.txt` in the
//!   directory `bin/`[`CONTAINER_REPORTS_FILE`] names (when it names one) and to the worker's
//!   log; a non-zero exit fails the job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use rm_fake_github::jit::AssignedJob;

use crate::worker::StepDirs;

/// The worker's variable naming the job-started hook (actions/runner's "pre-job script").
pub const JOB_STARTED_HOOK_ENV: &str = "ACTIONS_RUNNER_HOOK_JOB_STARTED";
/// The worker's variable naming the job-completed hook (actions/runner's "post-job script"):
/// run after the job's last step, its output in the job's log.
pub const JOB_COMPLETED_HOOK_ENV: &str = "ACTIONS_RUNNER_HOOK_JOB_COMPLETED";
/// The job's container step, in the package's `bin/`: a `sh` script run in a container.
pub const CONTAINER_STEP_SCRIPT: &str = "container-step.sh";
/// In the package's `bin/`: the image the container step runs in (one line).
pub const CONTAINER_IMAGE_FILE: &str = "container-image";
/// In the package's `bin/`: the directory the container step's stdout is appended to (one line).
pub const CONTAINER_REPORTS_FILE: &str = "container-reports";
/// The variable naming a step's environment file.
const GITHUB_ENV: &str = "GITHUB_ENV";
/// Names `$GITHUB_ENV` may not set (`SetEnvFileCommand._setEnvBlockList`).
const SET_ENV_BLOCKED: [&str; 1] = ["NODE_OPTIONS"];
/// Where a step's file commands are made, below `RUNNER_TEMP` (the runner's own folder name).
const FILE_COMMANDS_DIR: &str = "_runner_file_commands";
/// How long the container step may take (a `docker run` of a small image: seconds).
const CONTAINER_STEP_TIMEOUT: Duration = Duration::from_secs(180);

/// The job's environment dictionary (`Global.EnvironmentVariables`): what `$GITHUB_ENV` added.
/// Names compare as bytes, as the runner's do off Windows.
pub(crate) type JobEnv = BTreeMap<String, String>;

/// Why an environment file was refused: the runner's words (`EnvFileKeyValuePairs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EnvFileError {
    /// A line that is neither `NAME=value` nor `NAME<<DELIM`.
    Format(String),
    /// `NAME=value` with no name. (The runner means to refuse it; its check tests the line,
    /// which is never empty there, so it takes the empty name and fails later.)
    EmptyName(String),
    /// `NAME<<DELIM` with no name or no delimiter.
    EmptyHeredoc(String),
    /// A heredoc whose delimiter never comes.
    NoDelimiter(String),
    /// A heredoc's last line before the end of the file, without a newline.
    MissingNewline,
}

impl std::fmt::Display for EnvFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvFileError::Format(line) => write!(f, "Invalid format '{line}'"),
            EnvFileError::EmptyName(line) => {
                write!(f, "Invalid format '{line}'. Name must not be empty")
            }
            EnvFileError::EmptyHeredoc(line) => write!(
                f,
                "Invalid format '{line}'. Name must not be empty and delimiter must not be empty"
            ),
            EnvFileError::NoDelimiter(delimiter) => {
                write!(
                    f,
                    "Invalid value. Matching delimiter not found '{delimiter}'"
                )
            }
            EnvFileError::MissingNewline => {
                write!(f, "Invalid value. EOF marker missing new line.")
            }
        }
    }
}

impl std::error::Error for EnvFileError {}

/// The next line of `text` from `*index` (up to a `\n`, which is not part of it; a `\r` is, as
/// the runner reads off Windows), and whether a newline ended it; `None` at the end.
fn next_line<'a>(text: &'a str, index: &mut usize) -> Option<(&'a str, bool)> {
    let rest = text.get(*index..).filter(|rest| !rest.is_empty())?;
    match rest.find('\n') {
        Some(lf) => {
            *index += lf + 1;
            Some((&rest[..lf], true))
        }
        None => {
            *index = text.len();
            Some((rest, false))
        }
    }
}

/// The pairs of an environment file, in order, as the runner reads them: empty lines skipped;
/// `NAME=value` where a `=` comes before any `<<` (the value is the rest of the line, `=` and
/// `<<` included); `NAME<<DELIM` otherwise, whose value is the lines up to the one that is
/// exactly `DELIM`, joined by their newlines. Pure.
pub(crate) fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, EnvFileError> {
    let mut pairs = Vec::new();
    let mut index = 0;
    while let Some((line, _)) = next_line(text, &mut index) {
        if line.is_empty() {
            continue;
        }
        let equals = line.find('=');
        let heredoc = line.find("<<");
        match (equals, heredoc) {
            (Some(eq), h) if h.is_none_or(|h| eq < h) => {
                let (name, value) = (&line[..eq], &line[eq + 1..]);
                if name.is_empty() {
                    return Err(EnvFileError::EmptyName(line.to_owned()));
                }
                pairs.push((name.to_owned(), value.to_owned()));
            }
            (_, Some(h)) => {
                let (name, delimiter) = (&line[..h], &line[h + 2..]);
                if name.is_empty() || delimiter.is_empty() {
                    return Err(EnvFileError::EmptyHeredoc(line.to_owned()));
                }
                let (start, mut end) = (index, index);
                loop {
                    match next_line(text, &mut index) {
                        Some((value_line, _)) if value_line == delimiter => break,
                        None => return Err(EnvFileError::NoDelimiter(delimiter.to_owned())),
                        Some((_, false)) => return Err(EnvFileError::MissingNewline),
                        Some((_, true)) => end = index - 1,
                    }
                }
                pairs.push((name.to_owned(), text[start..end].to_owned()));
            }
            _ => return Err(EnvFileError::Format(line.to_owned())),
        }
    }
    Ok(pairs)
}

/// Adds a step's environment file's pairs to the job's dictionary (a later pair of a name
/// replaces the earlier); the names the runner refuses to take are skipped and returned.
pub(crate) fn take_env_file(job_env: &mut JobEnv, text: &str) -> Result<Vec<String>, EnvFileError> {
    let mut skipped = Vec::new();
    for (name, value) in parse_env_file(text)? {
        if SET_ENV_BLOCKED
            .iter()
            .any(|b| b.eq_ignore_ascii_case(&name))
        {
            skipped.push(name);
            continue;
        }
        job_env.insert(name, value);
    }
    Ok(skipped)
}

/// A step's environment dictionary: the job's, then what the handler sets (`handler`), which
/// overwrites the job's value of a name it sets. Pure.
pub(crate) fn step_dictionary(job_env: &JobEnv, handler: &[(String, String)]) -> JobEnv {
    let mut dictionary = job_env.clone();
    for (name, value) in handler {
        dictionary.insert(name.clone(), value.clone());
    }
    dictionary
}

/// The arguments of the container step's `docker` (`DockerRun`): each of the dictionary's
/// names as `-e NAME` (docker takes the value from its own environment), the image, and the
/// script as `sh -c`'s. Pure.
pub(crate) fn container_args(dictionary: &JobEnv, image: &str, script: &str) -> Vec<String> {
    let mut args = vec!["run".to_owned(), "--rm".to_owned()];
    for name in dictionary.keys() {
        args.push("-e".to_owned());
        args.push(name.clone());
    }
    args.extend([image, "sh", "-c", script].map(str::to_owned));
    args
}

/// The shell the runner runs a `.sh` hook with and its arguments before the path: `bash` where
/// `path_var` (the worker's `PATH`) finds it, else `sh`. `None` for another extension.
pub(crate) fn hook_shell(hook: &Path, path_var: Option<&std::ffi::OsStr>) -> Option<Vec<String>> {
    if hook.extension().and_then(|e| e.to_str()) != Some("sh") {
        return None;
    }
    let bash = path_var
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join("bash"))
        .find(|candidate| is_executable(candidate));
    Some(match bash {
        Some(bash) => vec![
            bash.display().to_string(),
            "--noprofile".into(),
            "--norc".into(),
            "-e".into(),
            "-o".into(),
            "pipefail".into(),
        ],
        None => vec!["sh".into(), "-e".into()],
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A fresh, empty environment file for step number `n` of the job, below `RUNNER_TEMP`.
fn fresh_env_file(dirs: &StepDirs, n: usize) -> anyhow::Result<PathBuf> {
    let dir = dirs.temp.join(FILE_COMMANDS_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join(format!("set_env_{n}"));
    std::fs::write(&file, "").with_context(|| format!("cannot create {}", file.display()))?;
    Ok(file)
}

/// What a step run on the host left: whether it exited 0, its output (stdout, then stderr)
/// and the names its `$GITHUB_ENV` set that the runner does not take.
pub(crate) struct HostStep {
    pub(crate) ok: bool,
    pub(crate) output: String,
    pub(crate) skipped: Vec<String>,
}

/// Runs `program args` on the host as step number `n`, in the workspace, with the worker's
/// environment plus `env` and a fresh `$GITHUB_ENV`; once it exits, that file's pairs join
/// `job_env` (a malformed file is an error: the step fails).
async fn run_on_host(
    program: &str,
    args: &[String],
    env: &JobEnv,
    dirs: &StepDirs,
    n: usize,
    job_env: &mut JobEnv,
) -> anyhow::Result<HostStep> {
    std::fs::create_dir_all(&dirs.workspace)?;
    let env_file = fresh_env_file(dirs, n)?;
    let out = tokio::process::Command::new(program)
        .args(args)
        .current_dir(&dirs.workspace)
        .envs(env)
        .env(GITHUB_ENV, &env_file)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {program}"))?;
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&env_file)
        .with_context(|| format!("cannot read {}", env_file.display()))?;
    let skipped = take_env_file(job_env, &text)?;
    Ok(HostStep {
        ok: out.status.success(),
        output,
        skipped,
    })
}

/// Runs a job hook `hook` (the job-started one as step 0, the job-completed one after the last
/// step): its environment is the worker's, the job's identity (`identity`) and `$GITHUB_ENV`. A
/// hook that is not there or not a `.sh` is an error, as it fails the real runner's step.
pub(crate) async fn run_job_hook(
    hook: &Path,
    identity: &[(String, String)],
    dirs: &StepDirs,
    job_env: &mut JobEnv,
) -> anyhow::Result<HostStep> {
    if !hook.is_file() {
        bail!(
            "the job-started hook {}: File doesn't exist",
            hook.display()
        );
    }
    let mut shell = hook_shell(hook, std::env::var_os("PATH").as_deref()).with_context(|| {
        format!(
            "{} is not a valid path to a script. Make sure it ends in '.sh', '.ps1' or '.js'.",
            hook.display()
        )
    })?;
    let program = shell.remove(0);
    shell.push(hook.display().to_string());
    let env: JobEnv = identity.iter().cloned().collect();
    run_on_host(&program, &shell, &env, dirs, 0, job_env).await
}

/// Runs the host step `script` with `sh` (step 1): the worker's environment, the job's
/// dictionary, and what the handler sets over it.
pub(crate) async fn run_host_step(
    script: &Path,
    handler: &[(String, String)],
    dirs: &StepDirs,
    job_env: &mut JobEnv,
) -> anyhow::Result<HostStep> {
    let env = step_dictionary(job_env, handler);
    run_on_host(
        "sh",
        &[script.display().to_string()],
        &env,
        dirs,
        1,
        job_env,
    )
    .await
}

/// The container step of a package: its script, its image, and where its stdout is reported.
pub(crate) struct ContainerStep {
    pub(crate) script: String,
    pub(crate) image: String,
    pub(crate) reports: Option<PathBuf>,
}

impl ContainerStep {
    /// The container step of the package whose `bin/` is `bin`; `None` without its script.
    pub(crate) fn of(bin: &Path) -> anyhow::Result<Option<ContainerStep>> {
        let script_path = bin.join(CONTAINER_STEP_SCRIPT);
        if !script_path.is_file() {
            return Ok(None);
        }
        let read = |name: &str| {
            std::fs::read_to_string(bin.join(name))
                .with_context(|| format!("cannot read bin/{name}"))
        };
        let image = read(CONTAINER_IMAGE_FILE)?.trim().to_owned();
        if image.is_empty() {
            bail!("bin/{CONTAINER_IMAGE_FILE} names no image");
        }
        let reports = std::fs::read_to_string(bin.join(CONTAINER_REPORTS_FILE))
            .ok()
            .map(|dir| PathBuf::from(dir.trim()))
            .filter(|dir| !dir.as_os_str().is_empty());
        Ok(Some(ContainerStep {
            script: read(CONTAINER_STEP_SCRIPT)?,
            image,
            reports,
        }))
    }

    /// Runs it for `job` with the job's dictionary and what the handler sets: whether it
    /// exited 0, and its stdout then stderr. Needs `DOCKER_HOST` in the worker's environment.
    pub(crate) async fn run(
        &self,
        job: &AssignedJob,
        handler: &[(String, String)],
        job_env: &JobEnv,
    ) -> anyhow::Result<(bool, String)> {
        if std::env::var_os("DOCKER_HOST").is_none_or(|h| h.is_empty()) {
            bail!("a container step needs Docker, and this runner has no DOCKER_HOST");
        }
        let dictionary = step_dictionary(job_env, handler);
        let run = tokio::process::Command::new("docker")
            .args(container_args(&dictionary, &self.image, &self.script))
            .envs(&dictionary)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(CONTAINER_STEP_TIMEOUT, run)
            .await
            .context("the container step timed out")?
            .context("cannot run docker")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(dir) = &self.reports {
            use std::io::Write as _;
            let file = dir.join(format!("{}.container.txt", file_safe(&job.name)));
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .and_then(|mut f| f.write_all(stdout.as_bytes()))
                .with_context(|| format!("cannot append to {}", file.display()))?;
        }
        let mut output = stdout;
        output.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), output))
    }
}

/// `name` with every character but ASCII letters, digits, `-`, `_` and `.` as `_`.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_env_file_reads_as_the_runner_reads_it() {
        let ok: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            ("\n\n", &[]),
            ("A=1\nB=2\n", &[("A", "1"), ("B", "2")]),
            ("A=1", &[("A", "1")]),
            // The value is the rest of the line: `=` and `<<` in it, spaces kept.
            ("A=x=y<<z \n", &[("A", "x=y<<z ")]),
            ("A=\n", &[("A", "")]),
            // A `\r` is part of the line off Windows.
            ("A=1\r\n", &[("A", "1\r")]),
            // Heredocs: the lines up to the delimiter, joined by their newlines.
            (
                "A<<EOF\none\ntwo\nEOF\nB=3\n",
                &[("A", "one\ntwo"), ("B", "3")],
            ),
            ("A<<EOF\nEOF\n", &[("A", "")]),
            ("A<<EOF\n\nEOF", &[("A", "")]),
            ("A<<EOF\nx=1\nEOF\n", &[("A", "x=1")]),
            // `<<` before `=`: a heredoc whose delimiter holds the `=`.
            ("A<<E=F\nv\nE=F\n", &[("A", "v")]),
            // A name twice: both, in order (the dictionary keeps the last).
            ("A=1\nA=2\n", &[("A", "1"), ("A", "2")]),
        ];
        for (text, want) in ok {
            assert_eq!(parse_env_file(text), Ok(pairs(want)), "{text:?}");
        }
        let refused: &[(&str, EnvFileError)] = &[
            ("JUST_A_NAME\n", EnvFileError::Format("JUST_A_NAME".into())),
            ("A=1\nbad line\n", EnvFileError::Format("bad line".into())),
            ("=1\n", EnvFileError::EmptyName("=1".into())),
            (
                "<<EOF\nx\nEOF\n",
                EnvFileError::EmptyHeredoc("<<EOF".into()),
            ),
            ("A<<\nx\n\n", EnvFileError::EmptyHeredoc("A<<".into())),
            ("A<<EOF\nx\n", EnvFileError::NoDelimiter("EOF".into())),
            ("A<<EOF\nx\nEOF2\n", EnvFileError::NoDelimiter("EOF".into())),
            ("A<<EOF\nx", EnvFileError::MissingNewline),
        ];
        for (text, want) in refused {
            assert_eq!(parse_env_file(text).as_ref(), Err(want), "{text:?}");
        }
        assert_eq!(
            EnvFileError::NoDelimiter("EOF".into()).to_string(),
            "Invalid value. Matching delimiter not found 'EOF'"
        );
    }

    #[test]
    fn the_job_takes_a_step_s_pairs_but_not_node_options() {
        let mut job_env = JobEnv::new();
        job_env.insert("KEEP".into(), "1".into());
        job_env.insert("A".into(), "old".into());
        let skipped = take_env_file(&mut job_env, "A=new\nnode_options=--x\nB<<E\nb\nE\n").unwrap();
        assert_eq!(skipped, ["node_options"]);
        assert_eq!(
            job_env,
            JobEnv::from([
                ("A".into(), "new".into()),
                ("B".into(), "b".into()),
                ("KEEP".into(), "1".into()),
            ])
        );
        // A malformed file leaves the dictionary as it was.
        let before = job_env.clone();
        assert!(take_env_file(&mut job_env, "C=3\nbad\n").is_err());
        assert_eq!(job_env, before);
    }

    #[test]
    fn what_the_handler_sets_overwrites_the_job_s_value() {
        let job_env = JobEnv::from([
            (
                "ACTIONS_RESULTS_URL".into(),
                "http://10.213.0.1:8736/".into(),
            ),
            ("FROM_THE_HOOK".into(), "1".into()),
        ]);
        // An unpatched worker sets the results URL from the job message: GitHub's wins.
        let unpatched = pairs(&[
            ("ACTIONS_RESULTS_URL", "https://results.example/"),
            ("GITHUB_JOB", "j"),
        ]);
        let step = step_dictionary(&job_env, &unpatched);
        assert_eq!(step["ACTIONS_RESULTS_URL"], "https://results.example/");
        assert_eq!(step["FROM_THE_HOOK"], "1");
        assert_eq!(step["GITHUB_JOB"], "j");
        // A redirected worker does not: the job's value (the hook's) stays.
        let redirected = pairs(&[("GITHUB_JOB", "j")]);
        let step = step_dictionary(&job_env, &redirected);
        assert_eq!(step["ACTIONS_RESULTS_URL"], "http://10.213.0.1:8736/");
    }

    #[test]
    fn a_container_gets_exactly_the_dictionary_s_names_and_no_values_in_its_arguments() {
        let dictionary = JobEnv::from([
            (
                "ACTIONS_RESULTS_URL".into(),
                "http://10.213.0.1:8736/".into(),
            ),
            ("ACTIONS_RUNTIME_TOKEN".into(), "secret.token.value".into()),
        ]);
        let args = container_args(&dictionary, "busybox:e2e", "echo hi");
        assert_eq!(
            args,
            [
                "run",
                "--rm",
                "-e",
                "ACTIONS_RESULTS_URL",
                "-e",
                "ACTIONS_RUNTIME_TOKEN",
                "busybox:e2e",
                "sh",
                "-c",
                "echo hi"
            ]
        );
        assert!(
            !args.iter().any(|a| a.contains("secret")),
            "a value on docker's command line"
        );
        assert_eq!(
            container_args(&JobEnv::new(), "i", "s"),
            ["run", "--rm", "i", "sh", "-c", "s"]
        );
    }

    #[test]
    fn a_sh_hook_runs_with_bash_where_the_path_has_it_else_sh() {
        let dir = tempfile::tempdir().unwrap();
        let bash = dir.path().join("bin/bash");
        std::fs::create_dir_all(bash.parent().unwrap()).unwrap();
        std::fs::write(&bash, "").unwrap();
        let hook = Path::new("/run/rm-cache/job-started.sh");
        // Not executable: not found.
        let path = std::env::join_paths([dir.path().join("bin")]).unwrap();
        assert_eq!(
            hook_shell(hook, Some(&path)),
            Some(vec!["sh".to_owned(), "-e".to_owned()])
        );
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&bash, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = hook_shell(hook, Some(&path)).unwrap();
        assert_eq!(found[0], bash.display().to_string());
        assert_eq!(
            found[1..],
            ["--noprofile", "--norc", "-e", "-o", "pipefail"]
        );
        assert_eq!(
            hook_shell(hook, None),
            Some(vec!["sh".to_owned(), "-e".to_owned()])
        );
        assert_eq!(hook_shell(Path::new("/opt/hook"), Some(&path)), None);
        assert_eq!(hook_shell(Path::new("/opt/hook.py"), Some(&path)), None);
    }

    /// The hook through a real shell: its `$GITHUB_ENV` joins the job's dictionary, it sees the
    /// job's identity and not the dictionary; a failing hook, a missing one and a malformed
    /// file are each a failure.
    #[tokio::test]
    async fn a_hook_s_environment_file_joins_the_job_s_dictionary() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = StepDirs {
            workspace: dir.path().join("w"),
            temp: dir.path().join("t"),
        };
        let hook = dir.path().join("hook.sh");
        std::fs::write(
            &hook,
            "printf 'SEEN_JOB=%s\\nSEEN_EARLIER=%s\\nMULTI<<END\\na\\nb\\nEND\\n' \"$GITHUB_JOB\" \"${EARLIER:-none}\" >> \"$GITHUB_ENV\"\n",
        )
        .unwrap();
        let identity = pairs(&[("GITHUB_JOB", "build")]);
        let mut job_env = JobEnv::from([("EARLIER".into(), "1".into())]);
        let done = run_job_hook(&hook, &identity, &dirs, &mut job_env)
            .await
            .unwrap();
        assert!(done.ok, "{}", done.output);
        assert_eq!(job_env["SEEN_JOB"], "build");
        assert_eq!(
            job_env["SEEN_EARLIER"], "none",
            "the hook saw the dictionary"
        );
        assert_eq!(job_env["MULTI"], "a\nb");

        // `-e`: a failing command fails the hook.
        std::fs::write(&hook, "false\necho 'LATE=1' >> \"$GITHUB_ENV\"\n").unwrap();
        let failed = run_job_hook(&hook, &identity, &dirs, &mut job_env)
            .await
            .unwrap();
        assert!(!failed.ok);
        assert!(!job_env.contains_key("LATE"));
        std::fs::write(&hook, "echo 'not a pair' >> \"$GITHUB_ENV\"\n").unwrap();
        let malformed = run_job_hook(&hook, &identity, &dirs, &mut job_env).await;
        assert!(malformed.is_err_and(|e| e.to_string().contains("Invalid format 'not a pair'")));
        let missing =
            run_job_hook(&dir.path().join("none.sh"), &identity, &dirs, &mut job_env).await;
        assert!(missing.is_err());

        // The host step after it: the dictionary, then the handler's values over it.
        let step = dir.path().join("step.sh");
        std::fs::write(
            &step,
            "echo \"$SEEN_JOB $OVER\"; echo 'FROM_STEP=1' >> \"$GITHUB_ENV\"\n",
        )
        .unwrap();
        job_env.insert("OVER".into(), "job".into());
        let ran = run_host_step(&step, &pairs(&[("OVER", "handler")]), &dirs, &mut job_env)
            .await
            .unwrap();
        assert!(ran.ok);
        assert_eq!(ran.output.trim(), "build handler");
        assert_eq!(job_env["FROM_STEP"], "1");
    }

    #[test]
    fn a_job_s_name_makes_a_plain_file_name() {
        assert_eq!(file_safe("save-a.1_x"), "save-a.1_x");
        assert_eq!(file_safe("../x y/z"), ".._x_y_z");
    }
}

//! The fake runner's `Runner.Listener`: what rm sees of GitHub's runner. Started as
//! `Runner.Listener run` in the runtime directory with the JIT configuration in
//! `ACTIONS_RUNNER_INPUT_JITCONFIG`, it registers with the fake GitHub, takes one job if one is
//! assigned (writing into `_work/` and `_diag/Worker_*.log`) and exits; without a job it listens
//! until it is stopped, as a real JIT runner does (writing only `_diag/Runner_*.log`), unless the
//! fake told it to give up after an idle time. The fake tells it at registration whether to
//! crash, hang, leave a background process behind, plant a symlink or leave a large checkout.
//! A job's "Set up job" (its actions) is the worker's ([`crate::worker`]); its job-started hook
//! and steps, on the host and in a container, are [`crate::steps`]'.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rm_fake_github::jit::{AssignedJob, CrashPoint, FakeJitConfig, RunnerBehavior};
use rm_fake_github::runner_client::RunnerSession;

/// The environment variable GitHub's runner reads its JIT configuration from.
const JIT_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";
/// How often an idle runner asks for a job.
const ACQUIRE_POLL: Duration = Duration::from_millis(100);
/// Exit status of a deliberate crash.
const CRASH_EXIT: u8 = 3;
/// The actions/runner version the fake runner says it is.
pub const VERSION: &str = "2.300.0";
/// actions/runner's exit status for an error it does not retry (`TerminatedError`).
const TERMINATED_EXIT: u8 = 1;
/// Created in the runtime's `_diag` by a test, it ends the running job now.
pub const FINISH_FILE: &str = "finish-job";
/// How long the background process left behind lives.
const BACKGROUND_SECS: &str = "300";
/// Written in the runtime's `_diag` once a job's checkout files are all written
/// ([`RunnerBehavior::checkout_files`]): `<files> files in <ms> ms`.
pub const CHECKOUT_DONE_FILE: &str = "checkout.done";
/// Files per directory of a written checkout: 100,000 files make 400 directories, about the
/// shape of a large repository, and no directory so large that its own size is what is measured.
const CHECKOUT_FILES_PER_DIR: u32 = 250;

/// Runs the listener with the process's arguments and environment; returns its exit status.
/// Any binary can be the package's `bin/Runner.Listener` by calling this (e.g. `rm-agent demo`
/// copying itself and dispatching on its own file name).
pub fn listener_main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args != ["run"] {
        eprintln!("usage: Runner.Listener run (got {args:?})");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("Runner.Listener failed: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn stamp() -> String {
    // Real runners name logs by UTC start time; the fake's formatting is good enough for tests.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{secs}-utc")
}

struct Log {
    path: std::path::PathBuf,
}

impl Log {
    fn open(dir: &Path, prefix: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{prefix}_{}.log", stamp()));
        std::fs::write(&path, "")?;
        Ok(Self { path })
    }

    fn line(&self, text: &str) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.path) {
            let _ = writeln!(f, "[{}] {text}", stamp());
        }
    }
}

async fn run() -> anyhow::Result<u8> {
    let encoded = std::env::var(JIT_ENV).with_context(|| format!("{JIT_ENV} is not set"))?;
    let config =
        FakeJitConfig::decode(&encoded).context("the JIT configuration is not the fake's")?;
    let cwd = std::env::current_dir()?;
    let diag = Log::open(&cwd.join("_diag"), "Runner")?;
    diag.line(&format!(
        "runner {} (id {}) starting",
        config.runner_name, config.runner_id
    ));
    let work = cwd.join(&config.work_folder);
    let server_url = config.server_url.clone();
    let session = RunnerSession::new(config);
    let behavior = session.register().await?;
    // actions/runner's own words once its session is open, as its terminal traces them into
    // the listener log (what supervision reads of a scale set's runner: `rm_runner::listening`).
    diag.line(&format!(
        "INFO Terminal] WRITE LINE: {}: Listening for Jobs",
        stamp()
    ));
    side_effects(&behavior, &work, &cwd, &diag)?;
    if behavior.hang {
        diag.line("hanging on purpose");
        std::future::pending::<()>().await;
    }
    if behavior.crash == Some(CrashPoint::AfterRegister) {
        diag.line("crashing on purpose after registering");
        return Ok(CRASH_EXIT);
    }
    // A real JIT runner listens until it gets its job or is stopped; only when told to does
    // the fake give up by itself.
    let deadline = behavior
        .idle_timeout_ms
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    loop {
        let acquired = match session.acquire().await {
            Ok(acquired) => acquired,
            // As actions/runner does when GitHub refuses its version: the words in its log (and
            // on stdout), and an exit with its terminated-error status.
            Err(e) if format!("{e:#}").contains("refused (403") => {
                let words = format!(
                    "An error occured: Runner version v{VERSION} is deprecated and cannot receive messages."
                );
                diag.line(&words);
                println!("{words}");
                return Ok(TERMINATED_EXIT);
            }
            Err(e) => return Err(e),
        };
        if let Some(job) = acquired {
            let places = Places {
                work: &work,
                cwd: &cwd,
                server_url: &server_url,
            };
            return run_job(&session, &behavior, job, &places, &diag).await;
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            diag.line("no job within the idle time; exiting");
            session.exit().await?;
            return Ok(0);
        }
        tokio::time::sleep(ACQUIRE_POLL).await;
    }
}

fn side_effects(
    behavior: &RunnerBehavior,
    work: &Path,
    cwd: &Path,
    diag: &Log,
) -> anyhow::Result<()> {
    if behavior.fork_background {
        let child = std::process::Command::new("sleep")
            .arg(BACKGROUND_SECS)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("cannot start the background process")?;
        std::fs::write(
            cwd.join("_diag").join("background.pid"),
            child.id().to_string(),
        )?;
        diag.line(&format!("left background process {} running", child.id()));
    }
    if let Some(port) = behavior.squat_port {
        // As a squatter would: try until the port is free (its owner restarting), then hold it
        // until the process exits.
        let report = cwd.join("_diag").join("squat.txt");
        std::thread::spawn(move || {
            loop {
                if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                    let _ = std::fs::write(&report, format!("bound 127.0.0.1:{port}"));
                    std::mem::forget(listener);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        diag.line(&format!("squatting 127.0.0.1:{port}"));
    }
    if let Some(target) = &behavior.plant_symlink {
        std::fs::create_dir_all(work)?;
        let link = work.join("planted-link");
        #[cfg(unix)]
        std::os::unix::fs::symlink(target, &link)
            .with_context(|| format!("cannot plant {}", link.display()))?;
        #[cfg(not(unix))]
        bail!("symlinks are only planted on unix (wanted {target})");
        diag.line("planted a symlink in the work folder");
    }
    Ok(())
}

/// Writes `files` small files under `checkout/src/`, [`CHECKOUT_FILES_PER_DIR`] to a
/// directory, each with a line of its own (real bytes to free, none of them sparse).
fn write_checkout(checkout: &Path, files: u32) -> std::io::Result<()> {
    let src = checkout.join("src");
    for dir in 0..files.div_ceil(CHECKOUT_FILES_PER_DIR) {
        let dir_path = src.join(format!("d{dir:04}"));
        std::fs::create_dir_all(&dir_path)?;
        let first = dir * CHECKOUT_FILES_PER_DIR;
        for n in first..files.min(first + CHECKOUT_FILES_PER_DIR) {
            std::fs::write(
                dir_path.join(format!("f{n:06}.rs")),
                format!("// file {n} of the checkout\npub const N: u32 = {n};\n"),
            )?;
        }
    }
    Ok(())
}

/// Writes `/tmp/rm-fill` a MiB at a time until a write fails; the failure.
fn fill_tmp() -> std::io::Error {
    use std::io::Write as _;
    let mut file = match std::fs::File::create("/tmp/rm-fill") {
        Ok(file) => file,
        Err(e) => return e,
    };
    let chunk = vec![0x5a_u8; 1 << 20];
    loop {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
            return e;
        }
    }
}

/// Where a job runs: the work folder, the runtime, and the fake GitHub's server root.
struct Places<'a> {
    work: &'a Path,
    cwd: &'a Path,
    server_url: &'a str,
}

async fn run_job(
    session: &RunnerSession,
    behavior: &RunnerBehavior,
    job: AssignedJob,
    places: &Places<'_>,
    diag: &Log,
) -> anyhow::Result<u8> {
    let (work, cwd) = (places.work, places.cwd);
    diag.line(&format!("running job {} ({})", job.job_id, job.name));
    let worker = Log::open(&cwd.join("_diag"), "Worker")?;
    worker.line(&format!(
        "job {} of run {} in {}",
        job.job_id, job.run_id, job.repository
    ));
    let Some((_, repo)) = job.repository.split_once('/') else {
        bail!("job repository {:?} is not owner/name", job.repository);
    };
    // "Set up job": the actions, before any step (a failure fails the job, as the worker's).
    match crate::worker::timed_set_up(&job, places.server_url, work, &cwd.join("_diag")).await {
        Ok(lines) => lines.iter().for_each(|l| worker.line(l)),
        Err(e) => {
            worker.line(&format!("Set up job failed: {e:#}"));
            return finish(session, &job, "failure", diag).await;
        }
    }
    let checkout = work.join(repo).join(repo);
    std::fs::create_dir_all(&checkout)?;
    let dirs = crate::worker::StepDirs {
        workspace: checkout.clone(),
        temp: work.join("_temp"),
    };
    // The job's dictionary: what its steps' `$GITHUB_ENV` add, from the hook on.
    let mut job_env = crate::steps::JobEnv::new();
    // The job-started hook, before the first step (a failure fails the job, and no step runs).
    if let Some(hook) =
        std::env::var_os(crate::steps::JOB_STARTED_HOOK_ENV).filter(|h| !h.is_empty())
    {
        let hook = std::path::PathBuf::from(hook);
        worker.line(&format!(
            "A job started hook has been configured: {}",
            hook.display()
        ));
        let identity = crate::worker::identity_env(&job, &dirs);
        let ran = crate::steps::run_job_hook(&hook, &identity, &dirs, &mut job_env).await;
        match ran {
            Ok(ran) if ran.ok => {
                ran.output.lines().for_each(|l| worker.line(l));
                let names: Vec<&String> = job_env.keys().collect();
                worker.line(&format!(
                    "job started hook done; the job's environment: {names:?}"
                ));
            }
            Ok(ran) => {
                ran.output.lines().for_each(|l| worker.line(l));
                worker.line("job started hook exited non-zero");
                return finish(session, &job, "failure", diag).await;
            }
            Err(e) => {
                worker.line(&format!("job started hook failed: {e:#}"));
                return finish(session, &job, "failure", diag).await;
            }
        }
    }
    std::fs::write(checkout.join("job.txt"), format!("job {}\n", job.job_id))?;
    if behavior.checkout_files > 0 {
        let (files, started) = (behavior.checkout_files, std::time::Instant::now());
        let dir = checkout.clone();
        // Off the runtime's one thread: the job's lock renewal goes on while the files are
        // written (seconds for 100,000 of them).
        tokio::task::spawn_blocking(move || write_checkout(&dir, files))
            .await?
            .context("cannot write the checkout")?;
        let took = started.elapsed().as_millis();
        worker.line(&format!("checked out {files} files in {took} ms"));
        std::fs::write(
            cwd.join("_diag").join(CHECKOUT_DONE_FILE),
            format!("{files} files in {took} ms\n"),
        )?;
    }
    if behavior.crash == Some(CrashPoint::DuringJob) {
        worker.line("crashing on purpose during the job");
        return Ok(CRASH_EXIT);
    }
    if behavior.exhaust_memory {
        worker.line("allocating memory until the kernel says no");
        let mut held: Vec<Vec<u8>> = Vec::new();
        loop {
            // Touched, so the pages are really charged to the cgroup.
            held.push(vec![0x5a_u8; 8 << 20]);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if behavior.fill_tmp {
        let failure = fill_tmp();
        println!("dd: error writing '/tmp/rm-fill': {failure}");
        worker.line("filled /tmp; the step failed");
        session.complete(job.job_id, "failure").await?;
        println!(
            "{}: Job {} completed with result: Failed",
            stamp(),
            job.name
        );
        return Ok(0);
    }
    let package = crate::worker::Package::running()?;
    let mut conclusion = behavior.conclusion.clone();
    let names = package.worker_names();
    let handler = crate::worker::step_env(&job, &dirs, &names);
    if let Some(script) = package.step() {
        worker.line(&format!(
            "step: {} (the worker sets {names:?} from the job message)",
            script.display()
        ));
        let ran = crate::steps::run_host_step(&script, &handler, &dirs, &mut job_env).await;
        let ok = match ran {
            Ok(ran) => {
                ran.output.lines().for_each(|l| worker.line(l));
                for name in &ran.skipped {
                    worker.line(&format!(
                        "Can't store {name} output parameter using '$GITHUB_ENV' command."
                    ));
                }
                ran.ok
            }
            Err(e) => {
                worker.line(&format!("the step's file commands failed: {e:#}"));
                false
            }
        };
        worker.line(&format!(
            "step exited {}",
            if ok { "0" } else { "non-zero" }
        ));
        if !ok {
            conclusion = "failure".into();
        }
    }
    let container = crate::steps::ContainerStep::of(&package.bin);
    match container {
        Ok(Some(step)) if conclusion != "failure" => {
            worker.line(&format!("container step in {}", step.image));
            let ok = match step.run(&job, &handler, &job_env).await {
                Ok((ok, output)) => {
                    output.lines().for_each(|l| worker.line(l));
                    ok
                }
                Err(e) => {
                    worker.line(&format!("the container step failed: {e:#}"));
                    false
                }
            };
            worker.line(&format!(
                "container step exited {}",
                if ok { "0" } else { "non-zero" }
            ));
            if !ok {
                conclusion = "failure".into();
            }
        }
        Ok(_) => {}
        Err(e) => {
            worker.line(&format!("the container step cannot run: {e:#}"));
            conclusion = "failure".into();
        }
    }
    // The job takes its duration, or ends early when a test creates FINISH_FILE in `_diag`
    // (a long job that must outlast a step of the test, and then end as a job does).
    let done = tokio::time::Instant::now() + Duration::from_millis(behavior.job_duration_ms);
    let finish_file = cwd.join("_diag").join(FINISH_FILE);
    while tokio::time::Instant::now() < done && !finish_file.exists() {
        tokio::time::sleep(ACQUIRE_POLL.min(done - tokio::time::Instant::now())).await;
    }
    // The job-completed hook, after the last step (its failure fails the job).
    if let Some(hook) =
        std::env::var_os(crate::steps::JOB_COMPLETED_HOOK_ENV).filter(|h| !h.is_empty())
    {
        let hook = std::path::PathBuf::from(hook);
        worker.line(&format!(
            "A job completed hook has been configured: {}",
            hook.display()
        ));
        let identity = crate::worker::identity_env(&job, &dirs);
        let mut after = crate::steps::JobEnv::new();
        match crate::steps::run_job_hook(&hook, &identity, &dirs, &mut after).await {
            Ok(ran) => {
                ran.output.lines().for_each(|l| worker.line(l));
                if !ran.ok {
                    worker.line("job completed hook exited non-zero");
                    conclusion = "failure".into();
                }
            }
            Err(e) => {
                worker.line(&format!("job completed hook failed: {e:#}"));
                conclusion = "failure".into();
            }
        }
    }
    worker.line(&format!("job finished: {conclusion}"));
    finish(session, &job, &conclusion, diag).await
}

/// Reports `job` done with `conclusion` and says so as actions/runner's listener does.
async fn finish(
    session: &RunnerSession,
    job: &AssignedJob,
    conclusion: &str,
    diag: &Log,
) -> anyhow::Result<u8> {
    session.complete(job.job_id, conclusion).await?;
    // As actions/runner's listener says it on its console (JobDispatcher), which the agent keeps.
    let result = match conclusion {
        "success" => "Succeeded",
        "cancelled" => "Canceled",
        _ => "Failed",
    };
    println!(
        "{}: Job {} completed with result: {result}",
        stamp(),
        job.name
    );
    diag.line("job done; exiting (ephemeral)");
    Ok(0)
}

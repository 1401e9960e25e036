//! Egress by name as `rm-agent run` wires it (`policy.egress`, issue 41): the host's resolver
//! bound before the runners' network is set up (its port goes into the host's table), each
//! runner of an egress policy registered with it before the runner starts and again after an
//! agent restart ([`Egress::start`], [`Egress::register`]), what each runner asked for and
//! reached written to the journal every [`FLUSH_INTERVAL`] and a last time before its network
//! goes ([`flush_loop`], [`Egress::last_record`]), the resolver's counts for `/metrics`
//! ([`EgressMetrics`]), and, so that a workflow's author sees why a connection failed, a
//! job-completed hook each runner runs that prints what its policy refused into the job's own
//! log ([`JOB_COMPLETED_HOOK`], written fresh when the hook asks the resolver for
//! `rm_egress::resolver::REPORT_NAME`), which the runner's kept logs then hold too. The resolver, the list and the records are `rm_egress`'s; the tables
//! `rm_runner::network`'s.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rm_egress::allow::{GITHUB_ESSENTIAL, uncovered};
use rm_egress::record::{Mode, Record, Tally};
use rm_egress::resolver::{Firewall, Resolver, Runner};
use rm_journal::{AttemptId, AttemptRecord, Attempts, Scope};
use rm_runner::network::{self, EgressRules, Names};
use rm_vocab::UnixMs;

use crate::config::Config;
use crate::config::egress::PolicyEgress;
use crate::exit::Exit;

/// How often what runners asked for and reached is written to the journal: what an agent
/// crash can lose of the names asked (the kernel keeps the addresses).
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// DNS's port, where the host's `resolv.conf` nameservers answer.
const DNS_PORT: u16 = 53;

/// Under the data directory: a directory per egress runner (its hook and its report), lent
/// read-only into the runner at `rm_runner::backend::EGRESS_IN_RUN`.
pub const EGRESS_DIR: &str = "egress";

/// The hook's file name in a runner's directory (`rm_runner::backend::EGRESS_HOOK_IN_RUN`).
const HOOK_FILE: &str = "job-completed.sh";

/// The report's file name in a runner's directory.
const REPORT_FILE: &str = "report";

/// In [`EGRESS_DIR`]: the resolver's port, which the next start takes again when it is free.
const PORT_FILE: &str = "resolver-port";

/// The job-completed hook every egress runner runs (actions/runner runs it after the job's last
/// step; its output is the job's log). It asks the agent's resolver for the report name, which
/// has the report written first (an absolute name: no search domain is tried), prints the
/// report, then runs the operator's own hook, if the policy's `env_file` named one.
pub const JOB_COMPLETED_HOOK: &str = r#"#!/bin/sh
# rm: what this job's egress policy refused (policy.egress; `rm-agent egress <job id>` on the
# runner's host lists everything). Written by rm-agent; read-only here.
getent hosts report.rm-egress.invalid. >/dev/null 2>&1 ||
    nslookup report.rm-egress.invalid. >/dev/null 2>&1 || true
cat /run/rm-egress/report 2>/dev/null || true
if [ -n "${RM_OPERATOR_JOB_COMPLETED_HOOK:-}" ]; then
    if command -v bash >/dev/null 2>&1; then
        exec bash -e "$RM_OPERATOR_JOB_COMPLETED_HOOK"
    fi
    exec sh -e "$RM_OPERATOR_JOB_COMPLETED_HOOK"
fi
"#;

/// Writes a runner's report for its hook: its tally joined with what its table counted.
struct ReportWriter {
    dir: std::path::PathBuf,
}

impl rm_egress::resolver::Reporter for ReportWriter {
    fn report(&self, runner: &Runner, tally: &Tally) {
        let observed = network::exists(&runner.names)
            .then(|| network::egress::observe(&runner.names).ok())
            .flatten();
        let record = tally.record(observed.as_ref(), &runner.allow);
        if let Err(e) = write_report(&self.dir.join(&runner.attempt_id), &record) {
            tracing::warn!(attempt = %runner.attempt_id, error = %e, "cannot write the runner's egress report");
        }
    }
}

/// Replaces a runner's report (a new file renamed over the old: the hook never reads half).
fn write_report(dir: &std::path::Path, record: &Record) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if !dir.is_dir() {
        return Ok(());
    }
    let staged = dir.join(".report.new");
    std::fs::write(&staged, record.job_log())?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&staged, dir.join(REPORT_FILE))
}

/// Makes a runner's directory with the hook and an empty report (mode 0755 and 0644, root's:
/// the runner reads them through a read-only mount).
fn make_runner_dir(dir: &std::path::Path, mode: Mode) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let hook = dir.join(HOOK_FILE);
    std::fs::write(&hook, JOB_COMPLETED_HOOK)?;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))?;
    write_report(
        dir,
        &Record {
            mode,
            ..Record::default()
        },
    )
}

/// The firewall the resolver opens addresses in: the runner's own table, through `nft` in its
/// namespace.
struct Nft;

impl Firewall for Nft {
    fn open(&self, names: &Names, addresses: &[(Ipv4Addr, Duration)]) -> Result<(), String> {
        network::egress::open(names, addresses).map_err(|e| e.to_string())
    }
}

/// The running resolver and what the agent needs to register runners with it.
pub struct Egress {
    resolver: Resolver,
    /// The nameservers runners' DNS is rewritten from (the host's `resolv.conf`).
    nameservers: Vec<Ipv4Addr>,
    /// Each egress policy's, by name.
    policies: HashMap<String, PolicyEgress>,
    /// `<data_dir>/egress`: a directory per registered runner ([`EGRESS_DIR`]).
    dir: std::path::PathBuf,
    /// One flush at a time, and none while a runner's last record is written.
    flushing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("port", &self.resolver.port())
            .field("nameservers", &self.nameservers)
            .finish_non_exhaustive()
    }
}

/// The IPv4 nameservers of a `resolv.conf` text (as the runner's network reads them). Pure.
pub fn nameservers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    network::nameservers(resolv_conf)
        .into_iter()
        .filter_map(|server| match server {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// Where the resolver asks: `host.dns_upstream`, else the nameservers at port 53. Pure.
pub fn upstreams(dns_upstream: Option<SocketAddr>, nameservers: &[Ipv4Addr]) -> Vec<SocketAddr> {
    match dns_upstream {
        Some(upstream) => vec![upstream],
        None => nameservers
            .iter()
            .map(|ns| SocketAddr::from((*ns, DNS_PORT)))
            .collect(),
    }
}

impl Egress {
    /// Binds the resolver when a policy has `egress` (`None` otherwise), says which of
    /// GitHub's essential endpoints the host's list leaves out, and registers the runners an
    /// earlier agent left running.
    pub async fn start(
        config: &Config,
        journal: &rm_journal::Store,
    ) -> Result<Option<Arc<Egress>>, Exit> {
        let policies: HashMap<String, PolicyEgress> = config
            .policies
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.egress.clone()?)))
            .collect();
        if policies.is_empty() {
            return Ok(None);
        }
        let resolv = std::fs::read_to_string(network::RESOLV_CONF).unwrap_or_default();
        let nameservers = nameservers(&resolv);
        if nameservers.is_empty() {
            return Err(Exit::usage(format!(
                "policy.egress rewrites runners' DNS to the agent's resolver from the nameservers of {}, which names no IPv4 nameserver; name one there (runners read it)",
                network::RESOLV_CONF
            )));
        }
        let upstreams = upstreams(config.host.egress.dns_upstream, &nameservers);
        let dir = config.data_dir.join(EGRESS_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Exit::runtime(anyhow::anyhow!("cannot make {}: {e}", dir.display())))?;
        // The port the last agent of this data directory used, kept (see `bind_preferring`).
        let port_file = dir.join(PORT_FILE);
        let preferred = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|text| text.trim().parse::<u16>().ok());
        let resolver = Resolver::bind_preferring(preferred, upstreams.clone(), Arc::new(Nft))
            .await
            .map_err(|e| Exit::runtime(anyhow::anyhow!(e)))?;
        if let Err(e) = std::fs::write(&port_file, resolver.port().to_string()) {
            tracing::warn!(error = %e, file = %port_file.display(), "cannot keep the egress resolver's port for the next start");
        }
        let missing = uncovered(&config.host.egress.allow, GITHUB_ESSENTIAL);
        if !missing.is_empty() {
            tracing::warn!(
                missing = %missing.join(", "),
                "host.egress_allow leaves out endpoints a runner needs to take a job from GitHub; egress policies' runners reach them only if their own lists do"
            );
        }
        tracing::info!(
            port = resolver.port(),
            upstreams = ?upstreams,
            "the egress resolver answers runners of egress policies"
        );
        resolver.set_reporter(Arc::new(ReportWriter { dir: dir.clone() }));
        let egress = Arc::new(Egress {
            resolver,
            nameservers,
            policies,
            dir,
            flushing: tokio::sync::Mutex::new(()),
        });
        egress.register_running(journal).await;
        egress.sweep();
        Ok(Some(egress))
    }

    /// The resolver's port on the host's loopback (for the host's table).
    pub fn port(&self) -> u16 {
        self.resolver.port()
    }

    /// Answers queries until the task is dropped.
    pub async fn serve(self: Arc<Self>) {
        self.resolver.serve().await;
    }

    /// The table rules of a runner of `policy`, when it has `egress`.
    pub fn rules(&self, policy: &str) -> Option<EgressRules> {
        let egress = self.policies.get(policy)?;
        Some(EgressRules {
            audit: egress.mode == Mode::Audit,
            networks: egress.allow.networks(),
            nameservers: self.nameservers.clone(),
        })
    }

    /// The resolver's view of an attempt's runner, when its policy has egress and it has a
    /// uid (a network of its own).
    fn runner_of(&self, record: &AttemptRecord) -> Option<Runner> {
        let egress = self.policies.get(&record.policy)?;
        let uid = record.uid?;
        Some(Runner {
            attempt_id: record.attempt_id.as_str().to_owned(),
            address: network::addresses(network::slot_of(uid)).runner,
            allow: Arc::clone(&egress.allow),
            mode: egress.mode,
            names: Names::of(record.attempt_id.short()),
        })
    }

    /// Answers the attempt's runner from now on (before it starts), its record going on from
    /// `earlier`, and makes its directory (its job-completed hook and report) when it has none.
    pub fn register(&self, record: &AttemptRecord, earlier: Option<Record>) {
        if let Some(runner) = self.runner_of(record) {
            let dir = self.dir.join(&runner.attempt_id);
            if !dir.join(HOOK_FILE).is_file()
                && let Err(e) = make_runner_dir(&dir, runner.mode)
            {
                tracing::warn!(error = %e, dir = %dir.display(), "cannot make the runner's egress directory; its job's log will not say what was refused");
            }
            self.resolver.register(runner, earlier);
        }
    }

    /// The runner's directory, lent into it, when it was made ([`Egress::register`]).
    pub fn report_dir(&self, record: &AttemptRecord) -> Option<std::path::PathBuf> {
        self.runner_of(record)?;
        let dir = self.dir.join(record.attempt_id.as_str());
        dir.join(HOOK_FILE).is_file().then_some(dir)
    }

    /// Removes the directories of runners no longer registered (a crash between a runner's
    /// last record and its directory's removal left them).
    fn sweep(&self) {
        let registered: std::collections::HashSet<String> = self
            .resolver
            .tallies()
            .into_iter()
            .map(|(runner, _)| runner.attempt_id)
            .collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let runner_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if runner_dir && !registered.contains(&name) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Registers every runner an earlier agent left running (not yet released), each going on
    /// from what the journal kept of it.
    async fn register_running(&self, journal: &rm_journal::Store) {
        let journal = journal.clone();
        let found = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let attempts = journal.attempts()?;
            let mut out = Vec::new();
            for record in attempts.list(Scope::Uncleaned, None)? {
                if record.released_at_ms.is_some() {
                    continue;
                }
                let earlier = attempts.egress(&record.attempt_id)?;
                out.push((record, earlier));
            }
            Ok(out)
        })
        .await;
        match found {
            Ok(Ok(found)) => {
                for (record, earlier) in found {
                    if !self.covers(&record) {
                        continue;
                    }
                    // Its namespace named again where this agent's mount namespace lost the
                    // name (the resolver opens addresses in it by name).
                    if let Some(identity) = rm_runner::process::journalled(
                        record.pid,
                        record.pid_start_time,
                        record.pid_boot_id.as_deref(),
                    ) {
                        let names = Names::of(record.attempt_id.short());
                        let reattached = tokio::task::spawn_blocking(move || {
                            network::egress::reattach(&names, identity)
                        })
                        .await;
                        match reattached {
                            Ok(Ok(true)) => {
                                tracing::info!(attempt = %record.attempt_id, "named a surviving runner's network namespace again")
                            }
                            Ok(Ok(false)) => {}
                            Ok(Err(e)) => {
                                tracing::warn!(attempt = %record.attempt_id, error = %e, "cannot reach a surviving runner's network namespace; its DNS answers fail closed")
                            }
                            Err(e) => tracing::warn!(error = %e, "the reattach task failed"),
                        }
                    }
                    let earlier = earlier.and_then(|json| serde_json::from_str(&json).ok());
                    self.register(&record, earlier);
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot read the runners an earlier agent left; their DNS is refused until they end"
                );
            }
            Err(e) => tracing::warn!(error = %e, "the egress recovery task failed"),
        }
    }

    /// Whether the attempt's runner is one this resolver answers (its policy has egress and
    /// it has a network of its own).
    pub fn covers(&self, record: &AttemptRecord) -> bool {
        self.runner_of(record).is_some()
    }

    /// The last record of an ending attempt's runner, read before its network goes, and the
    /// resolver told to stop answering it; `kept` is what the journal kept of it (an agent
    /// restarted since it was registered). The guard holds off the periodic flush until the
    /// caller has written the record, so an older one never replaces it.
    pub async fn last_record(
        &self,
        record: &AttemptRecord,
        kept: Option<String>,
    ) -> Option<(String, tokio::sync::MutexGuard<'_, ()>)> {
        let flushing = self.flushing.lock().await;
        let runner = self.runner_of(record)?;
        // The runner is stopped: its directory is not read any more.
        let _ = std::fs::remove_dir_all(self.dir.join(&runner.attempt_id));
        let tally = match self
            .resolver
            .unregister(runner.address, record.attempt_id.as_str())
        {
            Some((_, tally)) => tally,
            None => match kept.and_then(|json| serde_json::from_str::<Record>(&json).ok()) {
                Some(earlier) => Tally::resume(earlier),
                None => Tally::new(runner.mode),
            },
        };
        match record_of(&runner, &tally).await.and_then(|r| to_json(&r)) {
            Ok(json) => Some((json, flushing)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write what the runner reached");
                None
            }
        }
    }

    /// Writes every registered runner's record.
    async fn flush(&self, attempts: &Arc<std::sync::Mutex<Attempts>>) {
        let _flushing = self.flushing.lock().await;
        for (runner, tally) in self.resolver.tallies() {
            let json = match record_of(&runner, &tally).await.and_then(|record| {
                // The hook's report too, for a job that ends between two reports it asks.
                let _ = write_report(&self.dir.join(&runner.attempt_id), &record);
                to_json(&record)
            }) {
                Ok(json) => json,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot write what a runner reached");
                    continue;
                }
            };
            let Ok(id) = AttemptId::parse(&runner.attempt_id) else {
                continue;
            };
            let attempts = Arc::clone(attempts);
            let at = UnixMs::from_system_time(std::time::SystemTime::now());
            let written = tokio::task::spawn_blocking(move || {
                attempts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .write_egress(&id, &json, at)
            })
            .await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot journal what a runner reached"),
                Err(e) => tracing::debug!(error = %e, "the egress flush task failed"),
            }
        }
    }

    /// The resolver's counts, for `/metrics`.
    pub fn metrics(self: &Arc<Self>) -> EgressMetrics {
        EgressMetrics {
            egress: Arc::clone(self),
        }
    }
}

/// The runner's record: its tally joined with what its table counted (read in its namespace,
/// off the async workers; a namespace already gone gives the tally alone).
async fn record_of(runner: &Runner, tally: &Tally) -> Result<Record, String> {
    let names = runner.names.clone();
    let observed = tokio::task::spawn_blocking(move || {
        network::exists(&names)
            .then(|| network::egress::observe(&names))
            .and_then(|r| r.ok())
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(tally.record(observed.as_ref(), &runner.allow))
}

fn to_json(record: &Record) -> Result<String, String> {
    serde_json::to_string(record).map_err(|e| e.to_string())
}

/// Writes what runners asked for and reached every [`FLUSH_INTERVAL`], until `stop`.
pub async fn flush_loop(
    egress: Arc<Egress>,
    journal: rm_journal::Store,
    stop: impl std::future::Future<Output = ()>,
) {
    let attempts = match tokio::task::spawn_blocking(move || journal.attempts()).await {
        Ok(Ok(attempts)) => Arc::new(std::sync::Mutex::new(attempts)),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot open the journal for egress records; each runner's is written when it ends");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "the egress flush task failed");
            return;
        }
    };
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(FLUSH_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => egress.flush(&attempts).await,
        }
    }
}

/// The resolver's counts on `/metrics`.
pub struct EgressMetrics {
    egress: Arc<Egress>,
}

impl std::fmt::Debug for EgressMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressMetrics").finish_non_exhaustive()
    }
}

impl rm_receiver::prometheus_client::collector::Collector for EgressMetrics {
    fn encode(
        &self,
        mut encoder: rm_receiver::prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use rm_receiver::prometheus_client::encoding::EncodeMetric as _;
        use rm_receiver::prometheus_client::metrics::MetricType;
        use rm_receiver::prometheus_client::metrics::counter::ConstCounter;
        let counters = self.egress.resolver.counters();
        {
            let mut queries = encoder.encode_descriptor(
                "rm_egress_queries",
                "DNS queries of egress policies' runners, by verdict",
                None,
                MetricType::Counter,
            )?;
            for (verdict, counter) in [
                ("allowed", &counters.allowed),
                ("denied", &counters.denied),
                ("would_deny", &counters.would_deny),
                ("rate_limited", &counters.rate_limited),
                ("unknown_source", &counters.unknown_source),
            ] {
                ConstCounter::new(counter.load(Ordering::Relaxed))
                    .encode(queries.encode_family(&[("verdict", verdict)])?)?;
            }
        }
        let failed = encoder.encode_descriptor(
            "rm_egress_upstream_failures",
            "Allowed queries no upstream answered (answered SERVFAIL)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(counters.upstream_failed.load(Ordering::Relaxed)).encode(failed)?;
        let unsent = encoder.encode_descriptor(
            "rm_egress_reply_failures",
            "UDP replies to runners the kernel would not take",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(counters.reply_failed.load(Ordering::Relaxed)).encode(unsent)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_are_the_ipv4_ones_in_order() {
        assert_eq!(
            nameservers(
                "# generated\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 10.0.0.2\noptions edns0\nsearch example.test\n"
            ),
            vec![Ipv4Addr::new(127, 0, 0, 53), Ipv4Addr::new(10, 0, 0, 2)]
        );
        assert!(nameservers("").is_empty());
    }

    #[test]
    fn a_runners_directory_holds_the_hook_and_a_report_replaced_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("0123");
        make_runner_dir(&dir, Mode::Enforce).unwrap();
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join(HOOK_FILE)), 0o755);
        assert_eq!(
            std::fs::read_to_string(dir.join(HOOK_FILE)).unwrap(),
            JOB_COMPLETED_HOOK
        );
        // The hook asks the very name the resolver answers by writing the report.
        assert!(JOB_COMPLETED_HOOK.contains(&format!("{}.", rm_egress::resolver::REPORT_NAME)));
        assert!(JOB_COMPLETED_HOOK.contains(rm_runner::backend::EGRESS_IN_RUN));
        assert_eq!(mode(&dir.join(REPORT_FILE)), 0o644);
        assert_eq!(
            std::fs::read_to_string(dir.join(REPORT_FILE)).unwrap(),
            "rm egress (enforce): nothing refused (0 name(s) asked, all allowed)\n"
        );
        let mut tally = Tally::new(Mode::Enforce);
        tally.query("denied.test", rm_egress::record::Verdict::Denied, &[], 6);
        let record = tally.record(None, &rm_egress::allow::AllowList::empty());
        write_report(&dir, &record).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(REPORT_FILE)).unwrap(),
            record.job_log()
        );
        assert!(!dir.join(".report.new").exists());
        // A runner whose directory is gone gets none made by a late report.
        std::fs::remove_dir_all(&dir).unwrap();
        write_report(&dir, &record).unwrap();
        assert!(!dir.exists());
    }

    /// The resolver's counts are on `/metrics` as the contract names them, read at scrape time.
    #[tokio::test]
    async fn the_resolvers_counts_are_scraped() {
        use rm_receiver::prometheus_client::encoding::text::encode;
        use rm_receiver::prometheus_client::registry::Registry;
        let root = tempfile::tempdir().unwrap();
        let resolver = Resolver::bind(vec!["127.0.0.1:9".parse().unwrap()], Arc::new(Nft))
            .await
            .unwrap();
        let egress = Arc::new(Egress {
            resolver,
            nameservers: vec![],
            policies: HashMap::new(),
            dir: root.path().to_path_buf(),
            flushing: tokio::sync::Mutex::new(()),
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(egress.metrics()));
        let counters = egress.resolver.counters();
        counters.denied.fetch_add(3, Ordering::Relaxed);
        counters.reply_failed.fetch_add(1, Ordering::Relaxed);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "rm_egress_queries_total{verdict=\"denied\"} 3",
            "rm_egress_queries_total{verdict=\"allowed\"} 0",
            "rm_egress_queries_total{verdict=\"rate_limited\"} 0",
            "rm_egress_upstream_failures_total 0",
            "rm_egress_reply_failures_total 1",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
    }

    #[test]
    fn the_upstream_is_the_configured_one_or_the_nameservers() {
        let ns = [Ipv4Addr::new(127, 0, 0, 53), Ipv4Addr::new(10, 0, 0, 2)];
        assert_eq!(
            upstreams(None, &ns),
            vec![
                "127.0.0.53:53".parse::<SocketAddr>().unwrap(),
                "10.0.0.2:53".parse().unwrap()
            ]
        );
        let configured: SocketAddr = "10.9.9.9:5353".parse().unwrap();
        assert_eq!(upstreams(Some(configured), &ns), vec![configured]);
    }
}

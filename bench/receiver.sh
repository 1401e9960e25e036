#!/usr/bin/env bash
# The receiver benchmark (docs/performance.md): the same sustained load of signed, unique
# `workflow_job` deliveries sent to `rm-agent receive` and then to @octokit/webhooks on node:http,
# in one run. Prints both throughputs, their ratio and p50/p99/p99.9 latencies, and checks that every
# delivery rm-agent answered 2xx is in its journal.
#
# Usage: bench/receiver.sh            (env: DURATION=20s WARMUP=3s CONNECTIONS=32 JOBS=100000
#                                        RM_PORT=18080 NODE_PORT=18090 KEEP=0 STRICT=0)
# Exit: 0 measured and durable (goals are reported, and enforced only with STRICT=1);
#       1 a 2xx missing from the journal, a failed request, or a goal missed under STRICT=1.
set -euo pipefail

DURATION=${DURATION:-20s}
WARMUP=${WARMUP:-3s}
CONNECTIONS=${CONNECTIONS:-32}
# Pre-signed jobs (3 deliveries each, ~8.6 KiB a body): enough that neither receiver wraps around
# the pool at the defaults; the summary's pool_wrapped says if it did.
JOBS=${JOBS:-100000}
RM_PORT=${RM_PORT:-18080}
NODE_PORT=${NODE_PORT:-18090}
KEEP=${KEEP:-0}
STRICT=${STRICT:-0}
# The issue's goals: rm at least this many times Node's throughput, and its p99 under this.
GOAL_RATIO=4
GOAL_P99_MS=10
# Readiness and shutdown waits, in tenths of a second: every loop here is bounded.
READY_TENTHS=300
STOP_TENTHS=100

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$root/bench/out/receiver-$stamp"
work=$(mktemp -d "${TMPDIR:-/tmp}/rm-bench.XXXXXX")
mkdir -p "$out"
pids=()

cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # The journal can be gigabytes: keep it only when asked.
  if [[ $KEEP == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'receiver.sh: %s\n' "$*" >&2; exit 1; }

# A fresh random secret for this run, handed over in the environment only (never argv).
RM_WEBHOOK_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export RM_WEBHOOK_SECRET

http_code() { curl -s -o /dev/null -m 1 -w '%{http_code}' "$1" || true; }

# wait_ready PID URL WANT: until URL answers WANT ("any" = any HTTP answer), while PID lives.
wait_ready() {
  local pid=$1 url=$2 want=$3 code i
  for ((i = 0; i < READY_TENTHS; i++)); do
    kill -0 "$pid" 2>/dev/null || return 1
    code=$(http_code "$url")
    if [[ $want == any && $code != 000 ]] || [[ $code == "$want" ]]; then return 0; fi
    sleep 0.1
  done
  return 1
}

# stop PID SIGNAL: signal it and wait (bounded) for it to exit.
stop() {
  local pid=$1 sig=$2 i
  kill "-$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TENTHS; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# The share of all cores in use over one second (from /proc/stat), as a whole percentage.
cpu_busy_percent() {
  local a b
  a=$(head -1 /proc/stat)
  sleep 1
  b=$(head -1 /proc/stat)
  printf '%s\n%s\n' "$a" "$b" | awk '{ idle[NR] = $5 + $6; total[NR] = 0; for (i = 2; i <= NF; i++) total[NR] += $i }
    END { dt = total[2] - total[1]; printf "%d", (dt > 0 ? 100 * (dt - (idle[2] - idle[1])) / dt : 0) }'
}

# The disk's flush latency where the journal lives: every durable 2xx waits for at least one.
fsync_ms() {
  python3 - "$1" <<'PY'
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
times = []
for _ in range(50):
    os.pwrite(fd, b"x" * 4096, 0)
    start = time.perf_counter()
    os.fdatasync(fd)
    times.append((time.perf_counter() - start) * 1000)
os.close(fd)
os.unlink(path)
times.sort()
print(f"p50 {statistics.median(times):.2f} ms, p90 {times[44]:.2f} ms")
PY
}

port_free() { [[ $(http_code "http://127.0.0.1:$1/") == 000 ]]; }

# load NAME URL: the measured load against one receiver; its summary line goes to $out/NAME.json.
load() {
  "$root/target/release/receiver-load" --url "$2" --connections "$CONNECTIONS" \
    --warmup "$WARMUP" --duration "$DURATION" --jobs "$JOBS" \
    --guids-out "$work/$1.guids" >"$out/$1.json" 2>"$out/$1.load.log" ||
    die "the load generator failed against $1: $(cat "$out/$1.load.log")"
  cat "$out/$1.json" >&2
}

say "build (release): rm-agent, rm-bench"
(cd "$root" && cargo build --release -p rm-agent -p rm-bench)

say "install the Node receiver (@octokit/webhooks, from package-lock.json)"
(cd "$root/bench/node" && npm ci --no-audit --no-fund --loglevel=error)

port_free "$RM_PORT" || die "port $RM_PORT is in use; set RM_PORT"
port_free "$NODE_PORT" || die "port $NODE_PORT is in use; set NODE_PORT"

busy=$(cpu_busy_percent)
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "rustc: $(rustc --version)"
  echo "node: $(node --version), @octokit/webhooks $(node -p 'require(process.argv[1]).version' "$root/bench/node/node_modules/@octokit/webhooks/package.json" 2>/dev/null || echo '?')"
  echo "load: CONNECTIONS=$CONNECTIONS WARMUP=$WARMUP DURATION=$DURATION JOBS=$JOBS"
  echo "cpu busy before the run: ${busy}%"
  echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "fsync of $work (4 KiB write + fdatasync, 50 times): $(fsync_ms "$work")"
} >"$out/machine.txt"
cat "$out/machine.txt" >&2
# Two cores are shared by the generator and the receiver: anything else running skews both.
if ((busy > 10)); then
  echo "receiver.sh: warning: the machine is ${busy}% busy before the run; numbers will be low" >&2
fi

say "rm-agent receive on 127.0.0.1:$RM_PORT"
mkdir -p "$work/data"
cat >"$work/rm-agent.toml" <<EOF
data_dir = "$work/data"

[receiver]
listen = "127.0.0.1:$RM_PORT"
path = "/webhook"
EOF
"$root/target/release/rm-agent" receive --config "$work/rm-agent.toml" --data-dir "$work/data" \
  >"$out/rm-agent.log" 2>&1 &
rm_pid=$!
pids+=("$rm_pid")
# Out of bash's job table: no "Killed" notice when it is stopped; bash still reaps it.
disown "$rm_pid"
wait_ready "$rm_pid" "http://127.0.0.1:$RM_PORT/healthz" 200 ||
  die "rm-agent receive did not answer GET /healthz 200: $(tail -5 "$out/rm-agent.log")"
load rm "http://127.0.0.1:$RM_PORT/webhook"
# The journal's own view (commit time, batch size) explains the throughput; best effort.
curl -s -m 5 "http://127.0.0.1:$RM_PORT/metrics" >"$out/rm-metrics.txt" || true
# SIGKILL, not a graceful stop: a 2xx must already be committed, so nothing may depend on a
# shutdown path flushing it.
stop "$rm_pid" KILL

say "durability: every GUID rm-agent answered 2xx is in $work/data/journal.sqlite3"
[[ -f $work/data/journal.sqlite3 ]] || die "no journal at $work/data/journal.sqlite3"
python3 - "$work/data/journal.sqlite3" "$work/rm.guids" >"$out/durability.json" <<'EOF'
import json, sqlite3, sys
db, guids = sys.argv[1], sys.argv[2]
# A read-write open: SQLite recovers the WAL left by the killed process, as the agent would.
con = sqlite3.connect(db)
journalled = {row[0].lower() for row in con.execute("SELECT guid FROM deliveries")}
answered = [line.strip().lower() for line in open(guids) if line.strip()]
missing = [g for g in answered if g not in journalled]
print(json.dumps({"answered_2xx": len(answered), "journalled": len(journalled),
                  "missing": len(missing), "missing_sample": missing[:5]}))
EOF
cat "$out/durability.json" >&2

# The journal's fsyncs must not spill into the Node run.
sync
sleep 2

say "@octokit/webhooks on node:http, 127.0.0.1:$NODE_PORT"
node "$root/bench/node/server.mjs" "$NODE_PORT" >"$out/node.log" 2>&1 &
node_pid=$!
pids+=("$node_pid")
disown "$node_pid"
# The server answers 404 off /webhook: any HTTP answer means it listens.
wait_ready "$node_pid" "http://127.0.0.1:$NODE_PORT/ready" any ||
  die "the Node receiver did not start: $(tail -5 "$out/node.log")"
load node "http://127.0.0.1:$NODE_PORT/webhook"
stop "$node_pid" TERM

say "result"
python3 - "$out" "$GOAL_RATIO" "$GOAL_P99_MS" "$STRICT" <<'EOF'
import json, sys
out, goal_ratio, goal_p99, strict = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
rm = json.load(open(f"{out}/rm.json"))
node = json.load(open(f"{out}/node.json"))
durable = json.load(open(f"{out}/durability.json"))
ratio = rm["rps"] / node["rps"] if node["rps"] else float("inf")

def cell(value, fmt):
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items()) or "-"
    return fmt.format(value)

def row(label, key, fmt="{}"):
    print(f"  {label:<22}{cell(rm[key], fmt):>20}{cell(node[key], fmt):>28}")

print(f"  {'':<22}{'rm-agent receive':>20}{'@octokit/webhooks (node)':>28}")
row("throughput (req/s)", "rps", "{:.0f}")
row("p50 latency (ms)", "p50_ms", "{:.2f}")
row("p99 latency (ms)", "p99_ms", "{:.2f}")
row("p99.9 latency (ms)", "p999_ms", "{:.2f}")
row("max latency (ms)", "max_ms", "{:.2f}")
row("measured requests", "requests")
row("statuses", "statuses", "{}")
row("transport errors", "errors")
print(f"  throughput ratio rm/node: {ratio:.2f}x")

# Only well-formed, signed deliveries are sent: anything but 2xx from rm is a failure.
rm_non_2xx = sum(n for s, n in rm["statuses"].items() if not s.startswith("2"))
checks = {
    f"ratio >= {goal_ratio:g}x": ratio >= goal_ratio,
    f"rm p99 < {goal_p99:g} ms": rm["p99_ms"] < goal_p99,
    "every rm 2xx durable": durable["missing"] == 0 and durable["answered_2xx"] > 0,
    "rm: no errors, only 2xx": rm["errors"] == 0 and rm_non_2xx == 0,
}
for name, ok in checks.items():
    print(f"  {'PASS' if ok else 'MISS'}  {name}")
print(f"  durable: {durable['answered_2xx'] - durable['missing']}/{durable['answered_2xx']} "
      f"2xx GUIDs in the journal")

# Group commit at a glance, from rm-agent's /metrics (whole run, warm-up included).
metrics = {}
try:
    for line in open(f"{out}/rm-metrics.txt"):
        name, _, value = line.partition(" ")
        if name.startswith("rm_journal_commit_") and name.endswith(("_sum", "_count")):
            metrics[name] = float(value)
except (OSError, ValueError):
    pass
commits = metrics.get("rm_journal_commit_seconds_count", 0)
if commits:
    commit_ms = 1000 * metrics["rm_journal_commit_seconds_sum"] / commits
    batch = metrics.get("rm_journal_commit_batch_size_sum", 0) / commits
    print(f"  journal: {commits:.0f} commits, mean {commit_ms:.2f} ms each, "
          f"mean batch {batch:.1f} deliveries")

summary = {"rm": rm, "node": node, "ratio": round(ratio, 2), "durability": durable,
           "checks": checks}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps({"rm_rps": rm["rps"], "node_rps": node["rps"], "ratio": round(ratio, 2),
                  "rm_p50_ms": rm["p50_ms"], "rm_p99_ms": rm["p99_ms"], "rm_p999_ms": rm["p999_ms"],
                  "node_p50_ms": node["p50_ms"], "node_p99_ms": node["p99_ms"],
                  "node_p999_ms": node["p999_ms"],
                  "durable_missing": durable["missing"]}))
correctness = checks["every rm 2xx durable"] and checks["rm: no errors, only 2xx"]
sys.exit(0 if correctness and (all(checks.values()) or not strict) else 1)
EOF
echo "results in $out" >&2

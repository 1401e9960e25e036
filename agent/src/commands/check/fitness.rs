//! `check`'s host findings: the fitness gate's judgement of this host now ([`crate::fitness`],
//! the same probes and rules `run` applies before registering runners), and each policy's
//! `env_file` read and parsed as `run` reads it at start.

use super::Finding;
use crate::config::Config;
use crate::fitness::{self, Prober, Requirements, probe};

/// One `fitness` finding per problem (`fail`: no runner would be registered), or one `ok`.
pub(super) async fn fitness(config: &Config) -> Vec<Finding> {
    let mut required = Requirements::of(config, probe::runner_path());
    // `run` makes the runner root and the data directory; before the first start the
    // filesystem they will be made on is the one to judge.
    for dir in &mut required.dirs {
        if let Some(existing) = dir.path.ancestors().find(|p| p.exists()) {
            dir.path = existing.to_owned();
        }
    }
    // Under the gate's deadline: a hung mount is a `probe_timeout` finding, not a hung check.
    let mut prober = Prober::host(required.clone());
    let facts = match prober.measure().await {
        Ok(facts) => facts,
        Err(e) => {
            return vec![Finding::warn(
                "fitness",
                format!("the fitness probe failed: {e}"),
                "run `rm-agent check` again",
            )];
        }
    };
    let problems = fitness::judge(&required, &facts);
    if problems.is_empty() {
        return vec![Finding::ok(
            "fitness",
            format!(
                "host fit: free space and writability of the runner root and the data directory{}{}",
                if required.memory.is_some() {
                    ", memory for the largest memory_max"
                } else {
                    ""
                },
                if required.tools.is_empty() {
                    String::new()
                } else {
                    format!(", required tools ({})", required.tools.join(", "))
                }
            ),
        )];
    }
    problems
        .into_iter()
        .map(|p| {
            let (what, remedy) = match p.message.split_once(": ") {
                Some((what, remedy)) => (format!("{}: {what}", p.code), remedy.to_owned()),
                None => (p.code.clone(), p.message.clone()),
            };
            Finding::fail("fitness", what, remedy)
        })
        .collect()
}

/// One `env_file` finding per policy that names one: read and parsed, or why not.
pub(super) fn env_files(config: &Config) -> Vec<Finding> {
    config
        .policies
        .iter()
        .filter_map(|policy| {
            let path = policy.env_file.as_ref()?;
            Some(match rm_runner::env_file::load(path) {
                Ok(env) => Finding::ok(
                    "env_file",
                    format!(
                        "{} sets {} variable(s) for the runners",
                        path.display(),
                        env.vars().len()
                    ),
                ),
                Err(e) => Finding::fail(
                    "env_file",
                    e.to_string(),
                    "fix the line (KEY=VALUE, # comments, no reserved names) or the file's permissions; `rm-agent run` refuses to start until then",
                ),
            }
            .for_policy(policy))
        })
        .collect()
}

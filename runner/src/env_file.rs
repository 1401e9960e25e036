//! Operator variables for runners: a policy's `env_file` (`KEY=VALUE` lines) added to the
//! environment of each of its runners. This module owns the file's format, the names a file may
//! not set (what the runner launch contract, CONTRACT §5 and §7, reserves), and the merge into a
//! runner's environment. The file is read once when `rm-agent run` starts ([`load`]); a bad line
//! refuses the start (exit 2) naming the file and the line number, never the value: the values
//! reach every job of the policy, but a mistake must not print them into a log or a terminal.
//!
//! The format, deliberately small: one `KEY=VALUE` per line; blank lines and lines whose first
//! non-blank character is `#` are skipped; `KEY` is `[A-Za-z_][A-Za-z0-9_]*` (spaces around it
//! are trimmed); `VALUE` is everything after the first `=`, kept as written, except that one
//! pair of matching surrounding quotes (`"..."` or `'...'`) is removed. No expansion, no
//! `export`, no continuation lines. A key given twice is refused (which one wins would be a
//! guess).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// The largest env file read: a bigger one is not a list of variables.
pub(crate) const MAX_ENV_FILE_BYTES: u64 = 256 * 1024;

/// Names a file may not set: the runner launch contract sets them itself (CONTRACT §5: the JIT
/// configuration, the temporary directories; §7: `HOME` and the XDG base directories inside the
/// runtime).
pub(crate) const RESERVED_NAMES: &[&str] = &["HOME", "TMPDIR", "TMP", "TEMP"];

/// Prefixes a file may not set: `ACTIONS_RUNNER_INPUT_*` are the runner's own inputs (the JIT
/// configuration among them, CONTRACT §5), `XDG_*` point inside the runtime (CONTRACT §7), and
/// `RM_*` are the agent's own variables, which never reach a runner.
pub(crate) const RESERVED_PREFIXES: &[&str] = &[
    "ACTIONS_RUNNER_INPUT_",
    "XDG_",
    super::process::AGENT_ENV_PREFIX,
];

/// The variables of one env file, in file order. Its `Debug` shows the names only: the values
/// are the operator's and must not land in a log through a `{:?}` of a policy.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct OperatorEnv(Arc<Vec<(String, String)>>);

impl fmt::Debug for OperatorEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(key, _)| key))
            .finish()
    }
}

impl OperatorEnv {
    pub fn new(vars: Vec<(String, String)>) -> OperatorEnv {
        OperatorEnv(Arc::new(vars))
    }

    pub fn vars(&self) -> &[(String, String)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why an env file was refused. Never carries a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvFileError {
    #[error("cannot read the env file {file} ({reason})")]
    Unreadable { file: String, reason: String },
    #[error("{file} line {line}: {problem}")]
    Line {
        file: String,
        line: usize,
        problem: String,
    },
}

/// Whether `key` is one a file may not set.
pub(crate) fn is_reserved(key: &str) -> bool {
    RESERVED_NAMES.contains(&key) || RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Parses an env file's bytes (`file` names it in errors). Pure.
pub fn parse(file: &str, bytes: &[u8]) -> Result<OperatorEnv, EnvFileError> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (index, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let line = index + 1;
        let fail = |problem: String| EnvFileError::Line {
            file: file.to_owned(),
            line,
            problem,
        };
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let Ok(text) = std::str::from_utf8(raw) else {
            return Err(fail("is not UTF-8 text".to_owned()));
        };
        let trimmed = text.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        // The line is not echoed: a value typed without its `KEY=` is still a value.
        let Some((key, value)) = text.split_once('=') else {
            return Err(fail(
                "is not KEY=VALUE (and not blank or a # comment)".to_owned(),
            ));
        };
        let key = key.trim();
        if !is_name(key) {
            return Err(fail(
                "the name before `=` must be letters, digits and `_`, not starting with a digit"
                    .to_owned(),
            ));
        }
        if is_reserved(key) {
            return Err(fail(format!(
                "`{key}` is set by rm itself for every runner and may not be set here (reserved: {}, and names starting {})",
                RESERVED_NAMES.join(", "),
                RESERVED_PREFIXES.join(", ")
            )));
        }
        if value.contains('\0') {
            return Err(fail(format!("the value of `{key}` holds a NUL byte")));
        }
        if vars.iter().any(|(k, _)| k == key) {
            return Err(fail(format!(
                "`{key}` is set a second time; set each name once"
            )));
        }
        vars.push((key.to_owned(), unquote(value).to_owned()));
    }
    Ok(OperatorEnv::new(vars))
}

/// Reads and parses the env file at `path`.
pub fn load(path: &Path) -> Result<OperatorEnv, EnvFileError> {
    let file = path.display().to_string();
    let unreadable = |reason: String| EnvFileError::Unreadable {
        file: file.clone(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".to_owned()));
    }
    if meta.len() > MAX_ENV_FILE_BYTES {
        return Err(unreadable(format!(
            "larger than {MAX_ENV_FILE_BYTES} bytes"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    parse(&file, &bytes)
}

/// Loads the env file of every policy that names one: once, at start. `policies` are each
/// policy's name and `env_file`, in the configuration's order (the error's key counts them).
/// The variables by policy name; the error names the policy's `env_file` key, the file and the
/// line.
pub fn load_policies<'a>(
    policies: impl IntoIterator<Item = (&'a str, Option<&'a Path>)>,
) -> Result<HashMap<String, OperatorEnv>, (String, EnvFileError)> {
    let mut loaded = HashMap::new();
    for (index, (name, env_file)) in policies.into_iter().enumerate() {
        if let Some(path) = env_file {
            let env = load(path).map_err(|e| (format!("policy[{index}].env_file"), e))?;
            loaded.insert(name.to_owned(), env);
        }
    }
    Ok(loaded)
}

/// `env` (a runner's environment as the launch contract builds it) with the operator's
/// variables added: an operator's value replaces an inherited one of the same name (`LANG`,
/// `PATH`, a proxy), a reserved name is never taken (the parser refuses them already; this
/// keeps the contract whatever built `vars`). Sorted by name.
pub(crate) fn with_operator_env(
    mut env: Vec<(OsString, OsString)>,
    vars: &OperatorEnv,
) -> Vec<(OsString, OsString)> {
    for (key, value) in vars.vars() {
        if is_reserved(key) {
            continue;
        }
        env.retain(|(k, _)| k != key.as_str());
        env.push((OsString::from(key), OsString::from(value)));
    }
    env.sort();
    env
}

fn is_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// One pair of matching surrounding quotes removed.
fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(quote) && value.ends_with(quote) {
            return &value[1..value.len() - 1];
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(text: &str) -> Vec<(String, String)> {
        parse("linux.env", text.as_bytes()).unwrap().vars().to_vec()
    }

    fn refused(text: &str) -> (usize, String) {
        match parse("linux.env", text.as_bytes()) {
            Err(EnvFileError::Line {
                file,
                line,
                problem,
            }) => {
                assert_eq!(file, "linux.env");
                (line, problem)
            }
            other => panic!("{text:?} was not refused by line: {other:?}"),
        }
    }

    #[test]
    fn lines_comments_and_quotes() {
        let text = "# the linux fleet\n\nLANG=C.UTF-8\n  # indented comment\r\n\
                    CACHE_URL = http://cache:8080/x?a=b\nQUOTED=\"two words\"\nSINGLE='x'\nEMPTY=\n\
                    KEEP=  spaced  \r\nHALF=\"open\n";
        assert_eq!(
            vars(text),
            [
                ("LANG", "C.UTF-8"),
                ("CACHE_URL", " http://cache:8080/x?a=b"),
                ("QUOTED", "two words"),
                ("SINGLE", "x"),
                ("EMPTY", ""),
                ("KEEP", "  spaced  "),
                ("HALF", "\"open"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert!(vars("").is_empty());
        assert!(vars("\n\n# nothing\n").is_empty());
    }

    #[test]
    fn reserved_names_are_refused_with_their_line() {
        for (name, line) in [
            ("ACTIONS_RUNNER_INPUT_JITCONFIG", 2),
            ("ACTIONS_RUNNER_INPUT_NAME", 2),
            ("HOME", 2),
            ("TMPDIR", 2),
            ("TMP", 2),
            ("TEMP", 2),
            ("XDG_CONFIG_HOME", 2),
            ("XDG_RUNTIME_DIR", 2),
            ("RM_WEBHOOK_SECRET", 2),
        ] {
            let (at, problem) = refused(&format!("OK=1\n{name}=s3cr3t-value\n"));
            assert_eq!(at, line, "{name}");
            assert!(problem.contains(name), "{problem}");
            assert!(!problem.contains("s3cr3t"), "{problem}");
        }
        // Not reserved: the runner's other settings (job hooks) and ordinary names.
        assert_eq!(
            vars(
                "ACTIONS_RUNNER_HOOK_JOB_STARTED=/opt/hook.sh\nHOMEBREW=1\nPATH=/opt/bin:/usr/bin\n"
            )
            .len(),
            3
        );
    }

    #[test]
    fn a_bad_line_is_named_by_number_never_by_value() {
        for (text, line) in [
            ("A=1\njust-a-s3cr3t-token\n", 2),
            ("A=1\n\n# c\n1BAD=s3cr3t\n", 4),
            ("A=1\nexport B=s3cr3t\n", 2),
            ("A=1\nA=s3cr3t\n", 2),
            ("=s3cr3t\n", 1),
            ("B=s3cr3t\0x\n", 1),
        ] {
            let (at, problem) = refused(text);
            assert_eq!(at, line, "{text:?}: {problem}");
            assert!(!problem.contains("s3cr3t"), "{problem}");
        }
        let err = parse("f.env", b"A=1\nB=\xff\xfe s3cr3t\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.env line 2: is not UTF-8 text",
            "the message names the file and the line"
        );
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.env");
        assert!(matches!(
            load(&missing),
            Err(EnvFileError::Unreadable { file, .. }) if file == missing.display().to_string()
        ));
        assert!(matches!(
            load(dir.path()),
            Err(EnvFileError::Unreadable { .. })
        ));
        let file = dir.path().join("ok.env");
        std::fs::write(&file, "A=b\n").unwrap();
        assert_eq!(
            load(&file).unwrap().vars(),
            [("A".to_owned(), "b".to_owned())]
        );
    }

    #[test]
    fn a_policys_bad_line_names_its_key_the_file_and_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.env");
        let bad = dir.path().join("bad.env");
        std::fs::write(&good, "A=1\n").unwrap();
        std::fs::write(&bad, "A=1\n# c\nHOME=/root\n").unwrap();
        // As `[[policy]] name = "a" env_file = good`, `[[policy]] name = "b" env_file = bad`
        // reach it from the agent's configuration.
        let policies = [("a", Some(good.as_path())), ("b", Some(bad.as_path()))];
        let loaded = load_policies(policies[..1].iter().copied()).unwrap();
        assert_eq!(loaded["a"].vars(), [("A".to_owned(), "1".to_owned())]);
        assert!(!loaded.contains_key("b"));
        let (key, err) = load_policies(policies).unwrap_err();
        assert_eq!(key, "policy[1].env_file");
        assert_eq!(
            err,
            EnvFileError::Line {
                file: bad.display().to_string(),
                line: 3,
                problem: err_problem(&err),
            }
        );
    }

    fn err_problem(err: &EnvFileError) -> String {
        match err {
            EnvFileError::Line { problem, .. } => problem.clone(),
            EnvFileError::Unreadable { reason, .. } => reason.clone(),
        }
    }

    #[test]
    fn the_operators_values_join_the_runner_environment_never_over_the_reserved() {
        let base: Vec<(OsString, OsString)> =
            [("LANG", "C"), ("PATH", "/usr/bin"), ("TMPDIR", "/rt/tmp")]
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect();
        let vars = OperatorEnv::new(
            [
                ("LANG", "de_DE.UTF-8"),
                ("CACHE", "x"),
                ("TMPDIR", "/elsewhere"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        );
        let env = with_operator_env(base, &vars);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(get("LANG").as_deref(), Some("de_DE.UTF-8"));
        assert_eq!(get("CACHE").as_deref(), Some("x"));
        assert_eq!(get("TMPDIR").as_deref(), Some("/rt/tmp"));
        assert_eq!(env.len(), 4);
        // A Debug of the variables shows names only.
        assert_eq!(format!("{vars:?}"), r#"["LANG", "CACHE", "TMPDIR"]"#);
    }
}

//! Loading the agent's secrets from their files or environment variables, into `secrecy` values
//! that never reach a log, an error message or a child process.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rm_receiver::WebhookSecrets;
use secrecy::SecretString;

use crate::config::Config;
use crate::exit::Exit;

/// Comma-separated webhook secrets; wins over `github.webhook_secret_file`.
pub(crate) const WEBHOOK_SECRET_ENV: &str = "RM_WEBHOOK_SECRET";

/// The webhook secrets: `$RM_WEBHOOK_SECRET` (comma-separated) if set, else the file named by
/// `github.webhook_secret_file` (one secret per line). Every one is accepted, for rotation.
pub(crate) fn webhook_secrets(config: &Config) -> Result<WebhookSecrets, Exit> {
    let (secrets, from) = match std::env::var(WEBHOOK_SECRET_ENV) {
        Ok(value) if !value.trim().is_empty() => {
            (split(&value, ','), format!("${WEBHOOK_SECRET_ENV}"))
        }
        _ => match &config.github.webhook_secret_file {
            Some(path) => (
                split(&read_secret_file(path, "github.webhook_secret_file")?, '\n'),
                path.display().to_string(),
            ),
            None => {
                return Err(Exit::usage(format!(
                    "no webhook secret: set `github.webhook_secret_file` in {} or ${WEBHOOK_SECRET_ENV}; the receiver refuses to accept unsigned deliveries",
                    crate::config::display_file(config.source.as_deref())
                )));
            }
        },
    };
    WebhookSecrets::new(secrets).ok_or_else(|| {
        Exit::usage(format!(
            "{from} holds no webhook secret; put the App's webhook secret there"
        ))
    })
}

/// The App's private key as PEM text; wins over `github.private_key_file`.
pub(crate) const PRIVATE_KEY_ENV: &str = "RM_GITHUB_PRIVATE_KEY";

/// The (primary) GitHub App's private key: `$RM_GITHUB_PRIVATE_KEY` (the PEM text) if set,
/// else the file named by `github.private_key_file`. With `[[github.app]]` the first entry's
/// file, and the variable is refused: it holds one key and names no App. Whether it is a usable
/// key is for the GitHub client to say; this only refuses a missing, empty or world-readable
/// one.
pub(crate) fn private_key(config: &Config) -> Result<SecretString, Exit> {
    if config.github.app_list {
        if std::env::var(PRIVATE_KEY_ENV).is_ok_and(|v| !v.trim().is_empty()) {
            return Err(Exit::usage(format!(
                "${PRIVATE_KEY_ENV} is set but {} lists its Apps as `[[github.app]]`, each with its `private_key_file`; unset ${PRIVATE_KEY_ENV}",
                crate::config::display_file(config.source.as_deref())
            )));
        }
        let Some(path) = &config.github.private_key_file else {
            return Err(Exit::usage(
                "no `[[github.app]]` entry names a key file".to_owned(),
            ));
        };
        return key_file(path, "github.app[0].private_key_file");
    }
    let (pem, from) = match std::env::var(PRIVATE_KEY_ENV) {
        Ok(value) if !value.trim().is_empty() => (value, format!("${PRIVATE_KEY_ENV}")),
        _ => match &config.github.private_key_file {
            Some(path) => (
                read_secret_file(path, "github.private_key_file")?,
                path.display().to_string(),
            ),
            None => {
                return Err(Exit::usage(format!(
                    "no GitHub App private key: set `github.private_key_file` in {} or ${PRIVATE_KEY_ENV}; download the key from the App's settings page",
                    crate::config::display_file(config.source.as_deref())
                )));
            }
        },
    };
    if pem.trim().is_empty() {
        return Err(Exit::usage(format!(
            "{from} is empty; put the App's private key (PEM) there"
        )));
    }
    Ok(SecretString::from(pem))
}

/// A key file's PEM text, refused as [`private_key`] refuses the primary's.
fn key_file(path: &Path, key: &str) -> Result<SecretString, Exit> {
    let pem = read_secret_file(path, key)?;
    if pem.trim().is_empty() {
        return Err(Exit::usage(format!(
            "{key}: {} is empty; put the App's private key (PEM) there",
            path.display()
        )));
    }
    Ok(SecretString::from(pem))
}

/// The keys of the Apps after the primary (`[[github.app]]` entries 1..), each read and refused
/// as the primary's is.
pub(crate) fn more_app_keys(config: &Config) -> Result<Vec<rm_github::AppKey>, Exit> {
    config
        .github
        .more_apps
        .iter()
        .enumerate()
        .map(|(n, app)| {
            let key = format!("github.app[{}].private_key_file", n + 1);
            Ok(rm_github::AppKey {
                app_id: app.id,
                private_key_pem: key_file(&app.private_key_file, &key)?,
            })
        })
        .collect()
}

/// The relay subscriber token; wins over `relay.token_file`.
pub(crate) const RELAY_TOKEN_ENV: &str = "RM_RELAY_TOKEN";

/// The token `rm-relay channel token` issued for this host: `$RM_RELAY_TOKEN` if set, else the
/// file named by `relay.token_file`.
pub(crate) fn relay_token(config: &Config) -> Result<SecretString, Exit> {
    let token = match std::env::var(RELAY_TOKEN_ENV) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => match config.relay.as_ref().and_then(|r| r.token_file.as_ref()) {
            Some(path) => read_secret_file(path, "relay.token_file")?,
            None => {
                return Err(Exit::usage(format!(
                    "no relay token: set `relay.token_file` in {} or ${RELAY_TOKEN_ENV}; `rm-relay channel token CHANNEL HOST` issues one",
                    crate::config::display_file(config.source.as_deref())
                )));
            }
        },
    };
    let token = token.trim();
    if token.is_empty() {
        return Err(Exit::usage(
            "relay.token_file is empty; put the token `rm-relay channel token` printed there"
                .to_owned(),
        ));
    }
    Ok(SecretString::from(token.to_owned()))
}

/// The PostgreSQL journal's password (CONTRACT §9); the connection string may not hold one.
pub(crate) const JOURNAL_PASSWORD_ENV: &str = "RM_JOURNAL_PASSWORD";

/// The fleet's PostgreSQL journal to connect to, when `journal.url` names one: the configured
/// target with `$RM_JOURNAL_PASSWORD` as its password if set (taken as is: a password may
/// begin or end with spaces), else none (the server's own authentication; `run` with isolated
/// runners refuses a login without a password, over TCP or a unix socket, crate::journal_auth).
pub(crate) fn journal_target(config: &Config) -> Option<rm_journal::PgTarget> {
    let target = config.pg_journal.clone()?;
    Some(
        match journal_password(std::env::var(JOURNAL_PASSWORD_ENV).ok()) {
            Some(password) => target.with_password(password),
            None => target,
        },
    )
}

/// `$RM_JOURNAL_PASSWORD` as a secret; unset or empty is no password.
fn journal_password(value: Option<String>) -> Option<SecretString> {
    value.filter(|v| !v.is_empty()).map(SecretString::from)
}

/// A webhook notification endpoint's HMAC key (`notifications.webhook[N].secret_file`, named
/// by `key`): the file's text without its surrounding whitespace, refused when missing, empty
/// or readable by every user, like every secret file.
pub(crate) fn notification_secret(path: &Path, key: &str) -> Result<SecretString, Exit> {
    let text = read_secret_file(path, key)?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(Exit::usage(format!(
            "{key}: {} is empty; put the endpoint's HMAC key there, or remove `secret_file` to send unsigned bodies",
            path.display()
        )));
    }
    Ok(SecretString::from(secret.to_owned()))
}

/// An enterprise scale set's classic PAT (`scale_set[N].token_file`, named by `key`): the
/// file's text without its surrounding whitespace. Stricter than the other secret files: a
/// token that manages every runner of an enterprise is refused when its group or others have
/// any access to the file, not only when every user can read it.
pub(crate) fn enterprise_token(path: &Path, key: &str) -> Result<SecretString, Exit> {
    let metadata = std::fs::metadata(path).map_err(|err| {
        Exit::usage(format!(
            "{key}: cannot read {} ({err}); create it or fix the path",
            path.display()
        ))
    })?;
    if let Some(who) = open_to_others(metadata.permissions().mode()) {
        return Err(Exit::usage(format!(
            "{key}: {} is open to {who}; it holds an enterprise's runner-management token: run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    let text = read_secret_file(path, key)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Exit::usage(format!(
            "{key}: {} is empty; put the enterprise's classic personal access token (scope `manage_runners:enterprise`) there",
            path.display()
        )));
    }
    Ok(SecretString::from(token.to_owned()))
}

/// A registry's credentials for a policy's `docker://` image (`image_credentials_file`, named
/// by `key`): one line `user:password` (a registry token is its password), refused when
/// missing, empty, without the `:` or readable by every user, like every secret file.
pub(crate) fn registry_credentials(
    path: &Path,
    key: &str,
) -> Result<rm_image::registry::Credentials, Exit> {
    let text = read_secret_file(path, key)?;
    match text.trim().split_once(':') {
        Some((user, password)) if !user.is_empty() && !password.is_empty() => {
            Ok(rm_image::registry::Credentials {
                user: user.to_owned(),
                password: SecretString::from(password.to_owned()),
            })
        }
        _ => Err(Exit::usage(format!(
            "{key}: {} does not hold one line `user:password` (for a token: any user name, the token as the password)",
            path.display()
        ))),
    }
}

/// Who besides the owner has some access to a file of `mode`: its group, others, or both;
/// `None` for an owner-only file (`0600`, `0400`).
fn open_to_others(mode: u32) -> Option<&'static str> {
    match (mode & 0o070 != 0, mode & 0o007 != 0) {
        (false, false) => None,
        (true, false) => Some("its group"),
        (false, true) => Some("every user"),
        (true, true) => Some("its group and every user"),
    }
}

fn split(text: &str, separator: char) -> Vec<SecretString> {
    text.split(separator)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(SecretString::from)
        .collect()
}

/// Reads a secret file, refusing one that every user on the host can read.
fn read_secret_file(path: &Path, key: &str) -> Result<String, Exit> {
    let metadata = std::fs::metadata(path).map_err(|err| {
        Exit::usage(format!(
            "{key}: cannot read {} ({err}); create it or fix the path",
            path.display()
        ))
    })?;
    if metadata.permissions().mode() & 0o004 != 0 {
        return Err(Exit::usage(format!(
            "{key}: {} is readable by every user on this host; run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(|err| {
        Exit::usage(format!(
            "{key}: cannot read {} ({err}); check its owner and permissions",
            path.display()
        ))
    })
}

/// Refuses every configured secret file a runner uid of `pool` could read (CONTRACT §7): a job
/// holding one of them could mint tokens for every installation or forge deliveries.
pub(crate) fn refuse_readable_by_runners(
    config: &Config,
    pool: &rm_runner::isolate::Pool,
) -> Result<(), Exit> {
    let mut files: Vec<(String, Option<&Path>)> = config
        .github
        .apps()
        .into_iter()
        .map(|(_, path, key)| (key, path))
        .collect();
    files.push((
        "github.webhook_secret_file".to_owned(),
        config.github.webhook_secret_file.as_deref(),
    ));
    files.push((
        "relay.token_file".to_owned(),
        config.relay.as_ref().and_then(|r| r.token_file.as_deref()),
    ));
    // A job holding a notification key could forge the agent's alerts to their receiver.
    files.extend(
        config
            .webhook_notifications
            .iter()
            .enumerate()
            .map(|(index, webhook)| {
                (
                    format!("notifications.webhook[{index}].secret_file"),
                    webhook.secret_file.as_deref(),
                )
            }),
    );
    // A job holding an enterprise's PAT could register (or remove) runners across it.
    files.extend(
        config
            .scale_sets
            .iter()
            .enumerate()
            .filter_map(|(index, set)| {
                let enterprise = set.enterprise.as_ref()?;
                Some((
                    format!("scale_set[{index}].token_file"),
                    Some(enterprise.token_file.as_path()),
                ))
            }),
    );
    // A job holding a registry's credentials could push to it (a tag every later runner pulls)
    // or read what else it keeps.
    files.extend(config.policies.iter().enumerate().map(|(index, policy)| {
        (
            format!("policy[{index}].image_credentials_file"),
            policy
                .image
                .as_ref()
                .and_then(|image| image.credentials_file.as_deref()),
        )
    }));
    for (key, path) in files {
        let Some(path) = path else { continue };
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if let Some(why) = rm_runner::isolate::readable_by_runners(&meta, pool) {
            return Err(Exit::usage(format!(
                "{key}: a runner could read {} ({why}); run `chown root:root {} && chmod 600 {}`",
                path.display(),
                path.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret as _;

    /// An enterprise PAT's file: any access by its group or others refuses it (not only the
    /// world-readable bit the other secret files are refused for).
    #[test]
    fn an_enterprise_token_file_is_its_owner_s_alone() {
        // (mode, who else has access)
        let cases: [(u32, Option<&str>); 7] = [
            (0o600, None),
            (0o400, None),
            (0o100600, None),
            (0o640, Some("its group")),
            (0o620, Some("its group")),
            (0o602, Some("every user")),
            (0o644, Some("its group and every user")),
        ];
        for (mode, who) in cases {
            assert_eq!(open_to_others(mode), who, "{mode:o}");
        }
    }

    /// An enterprise's PAT file a runner uid owns is refused at start like every secret file a
    /// runner could read, naming its scale set's key.
    #[test]
    fn an_enterprise_token_file_a_runner_uid_owns_is_refused() {
        use rm_runner::isolate::{Pool, RunnerUids};
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("enterprise.pat");
        std::fs::write(&path, "ghp_secret123").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        let config = crate::config::from_text(&format!(
            "[[policy]]\nname = \"ent\"\ntarget = \"acme\"\nlabels = [\"ent\"]\n\
             [[scale_set]]\nname = \"ent\"\npolicy = \"ent\"\nenterprise = \"octo\"\ntoken_file = {:?}\n",
            path.display().to_string()
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let pool = Pool::resolve(&RunnerUids::Range {
            first: 4_100_000,
            last: 4_100_003,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            refuse_readable_by_runners(&config, &pool).is_ok(),
            "root's own"
        );
        if let Err(e) = std::os::unix::fs::chown(&path, Some(4_100_001), None) {
            eprintln!("skipped: cannot give the file to a runner uid ({e}); not root");
            return;
        }
        let message = refuse_readable_by_runners(&config, &pool)
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(
            message.starts_with("scale_set[0].token_file: a runner could read"),
            "{message}"
        );
    }

    /// A policy image's registry credentials are a secret file like the others: refused at
    /// start when every user may read it, or a runner uid owns it, naming the policy's key;
    /// root's own `0600` file is not.
    #[test]
    fn an_image_credentials_file_a_runner_could_read_is_refused() {
        use rm_runner::isolate::{Pool, RunnerUids};
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("registry");
        std::fs::write(&path, "ci:hunter2").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        let config = crate::config::from_text(&format!(
            "[[policy]]\nname = \"plain\"\ntarget = \"acme\"\nlabels = [\"plain\"]\n\n\
             [[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"ci\"]\n\
             image = \"docker://ghcr.io/acme/ci:1\"\nimage_credentials_file = {:?}\n",
            path.display().to_string()
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let pool = Pool::resolve(&RunnerUids::Range {
            first: 4_100_000,
            last: 4_100_003,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = || {
            refuse_readable_by_runners(&config, &pool)
                .err()
                .map(|e| e.message)
                .unwrap_or_default()
        };
        assert_eq!(refused(), "", "root's own 0600 file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604))
            .unwrap_or_else(|e| panic!("{e}"));
        let message = refused();
        assert!(
            message.starts_with("policy[1].image_credentials_file: a runner could read")
                && message.contains("readable by every user")
                && message.contains(&format!("chmod 600 {}", path.display())),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "no password in {message}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::cannot_run(
                "an_image_credentials_file_a_runner_could_read_is_refused",
                "root",
                "giving a file to a runner uid takes root",
            );
            return;
        }
        std::os::unix::fs::chown(&path, Some(4_100_002), None).unwrap_or_else(|e| panic!("{e}"));
        let message = refused();
        assert!(
            message.starts_with("policy[1].image_credentials_file: a runner could read")
                && message.contains("owned by runner uid 4100002"),
            "{message}"
        );
    }

    /// The token is read trimmed; a file open to its group, an empty one and a missing one
    /// are refused naming the key, never with the token's text.
    #[test]
    fn an_enterprise_token_is_read_trimmed_and_refused_as_its_rule_says() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("{e}"));
            path
        };
        let key = "scale_set[0].token_file";
        let good = file("good", "  ghp_secret123\n", 0o600);
        let token = enterprise_token(&good, key).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(token.expose_secret(), "ghp_secret123");
        for (path, problem) in [
            (file("group", "ghp_secret123", 0o640), "open to its group"),
            (file("empty", " \n", 0o600), "is empty"),
            (dir.path().join("missing"), "cannot read"),
        ] {
            let message = enterprise_token(&path, key)
                .err()
                .map(|e| e.message)
                .unwrap_or_default();
            assert!(
                message.starts_with(key) && message.contains(problem),
                "{}: {message}",
                path.display()
            );
            assert!(!message.contains("ghp_"), "no token in {message}");
        }
    }

    /// Every further App's key file is read and refused as the primary's is, each refusal
    /// naming the App's entry: a missing file, one every user can read, an empty one.
    #[test]
    fn each_app_s_key_file_is_refused_as_the_primary_s_is() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("{e}"));
            path
        };
        let good = file("good.pem", "-----BEGIN RSA PRIVATE KEY-----", 0o600);
        let open = file("open.pem", "-----BEGIN RSA PRIVATE KEY-----", 0o644);
        let empty = file("empty.pem", "\n", 0o600);
        let missing = dir.path().join("missing.pem");
        let config_with = |second: &Path| {
            let text = format!(
                "[[github.app]]\nid = 1\nprivate_key_file = {:?}\n\
                 [[github.app]]\nid = 2\nprivate_key_file = {:?}\n",
                good.display().to_string(),
                second.display().to_string()
            );
            crate::config::from_text(&text).unwrap_or_else(|e| panic!("{e}"))
        };
        let keys = more_app_keys(&config_with(&good)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(keys.iter().map(|k| k.app_id).collect::<Vec<_>>(), [2]);
        for (second, problem) in [
            (&open, "readable by every user"),
            (&empty, "is empty"),
            (&missing, "cannot read"),
        ] {
            let refused = more_app_keys(&config_with(second)).err();
            let message = refused.map(|e| e.message).unwrap_or_default();
            assert!(
                message.starts_with("github.app[1].private_key_file") && message.contains(problem),
                "{}: {message}",
                second.display()
            );
            assert!(!message.contains("BEGIN"), "no key text in {message}");
        }
    }
}

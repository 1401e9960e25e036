//! What a runner's own `_diag` folder says about whether it ran a job: a `Worker_*.log` is
//! written when a job is handed to the runner, `Runner_*.log` by the listener alone. The
//! classification is pure; reading the folder is one `read_dir`.

use std::path::Path;

use crate::lifecycle::JobEvidence;

/// The runner's diagnostics folder inside its runtime.
pub const DIAG_DIR: &str = "_diag";

/// Classifies the file names found in `_diag`.
pub fn classify<'a>(names: impl IntoIterator<Item = &'a str>) -> JobEvidence {
    let mut listener = false;
    for name in names {
        if name.starts_with("Worker_") && name.ends_with(".log") {
            return JobEvidence::RanAJob;
        }
        listener |= name.starts_with("Runner_") && name.ends_with(".log");
    }
    if listener {
        JobEvidence::NoJob
    } else {
        JobEvidence::Unknown
    }
}

/// Reads `<runtime>/_diag`; a missing or unreadable folder is [`JobEvidence::Unknown`].
pub fn read(runtime: &Path) -> JobEvidence {
    let Ok(entries) = std::fs::read_dir(runtime.join(DIAG_DIR)) else {
        return JobEvidence::Unknown;
    };
    let names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    match classify(names.iter().map(String::as_str)) {
        // The listener alone ran: did GitHub refuse its version? (rm_runner::refusal)
        JobEvidence::NoJob if rm_runner::refusal::refused(&runtime.join(DIAG_DIR)) => {
            JobEvidence::VersionRefused
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_log_means_a_job_ran() {
        assert_eq!(
            classify(["Runner_1-utc.log", "Worker_2-utc.log"]),
            JobEvidence::RanAJob
        );
        assert_eq!(classify(["Runner_1-utc.log"]), JobEvidence::NoJob);
        assert_eq!(classify(["pages", "Worker_x.txt"]), JobEvidence::Unknown);
        assert_eq!(classify([]), JobEvidence::Unknown);
    }

    #[test]
    fn reads_the_folder_and_treats_a_missing_one_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), JobEvidence::Unknown);
        std::fs::create_dir(dir.path().join(DIAG_DIR)).unwrap();
        std::fs::write(dir.path().join(DIAG_DIR).join("Runner_1.log"), "").unwrap();
        assert_eq!(read(dir.path()), JobEvidence::NoJob);
        std::fs::write(
            dir.path().join(DIAG_DIR).join("Runner_1.log"),
            "An error occured: Runner version v2.330.0 is deprecated and cannot receive messages.\n",
        )
        .unwrap();
        assert_eq!(read(dir.path()), JobEvidence::VersionRefused);
        std::fs::write(dir.path().join(DIAG_DIR).join("Worker_2.log"), "").unwrap();
        assert_eq!(
            read(dir.path()),
            JobEvidence::RanAJob,
            "a job ran after all"
        );
    }
}

//! The fitness gate's `[host]` keys, validated (the gate itself is `crate::fitness`, which
//! reads them): the free space the runner root and the data directory must keep, and the tools
//! the operator requires.

/// `host.min_free_space`'s default: room for a runner's runtime, its job's checkout and its
/// build output on a typical job.
pub const DEFAULT_MIN_FREE_SPACE: u64 = 2 << 30;

/// `host.data_dir_min_free_space`'s default: the journal and the status file grow slowly, but
/// a journal that cannot commit refuses deliveries.
pub const DEFAULT_DATA_DIR_MIN_FREE_SPACE: u64 = 256 << 20;

/// What the configuration asks of the host (`[host]` keys; validated, so never malformed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thresholds {
    /// `host.min_free_space`, bytes.
    pub min_free_space: u64,
    /// `host.data_dir_min_free_space`, bytes.
    pub data_dir_min_free_space: u64,
    /// `host.required_tools`: names (looked up on the runners' `PATH`) or absolute paths.
    pub required_tools: Vec<String>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_free_space: DEFAULT_MIN_FREE_SPACE,
            data_dir_min_free_space: DEFAULT_DATA_DIR_MIN_FREE_SPACE,
            required_tools: Vec::new(),
        }
    }
}

/// Validates the `[host]` keys of the gate; the error names the key (without `host.`) and why.
pub fn thresholds(
    min_free_space: Option<&str>,
    data_dir_min_free_space: Option<&str>,
    required_tools: Option<Vec<String>>,
) -> Result<Thresholds, (&'static str, String)> {
    let size = |key: &'static str, text: Option<&str>, default: u64| {
        match text {
        None => Ok(default),
        Some(text) => parse_size(text).ok_or_else(|| {
            (
                key,
                format!(
                    "`{text}` is not a size; write it like \"2GiB\", \"512MiB\" or \"2G\" (powers of 1024), or \"0\" to check writability only"
                ),
            )
        }),
    }
    };
    let min_free_space = size("min_free_space", min_free_space, DEFAULT_MIN_FREE_SPACE)?;
    let data_dir_min_free_space = size(
        "data_dir_min_free_space",
        data_dir_min_free_space,
        DEFAULT_DATA_DIR_MIN_FREE_SPACE,
    )?;
    let required_tools = required_tools.unwrap_or_default();
    for tool in &required_tools {
        let bare = !tool.is_empty() && !tool.contains('/') && tool.trim() == tool;
        if !(bare || tool.starts_with('/')) || tool.contains('\0') {
            return Err((
                "required_tools",
                format!(
                    "`{tool}` is neither a program name (looked up on the runners' PATH, e.g. \"git\") nor an absolute path (\"/usr/bin/docker\")"
                ),
            ));
        }
    }
    Ok(Thresholds {
        min_free_space,
        data_dir_min_free_space,
        required_tools,
    })
}

/// `"2GiB"`, `"2G"`, `"512MiB"`, `"512M"`, `"64KiB"`, `"1TiB"` (powers of 1024), `"1024"` bytes,
/// or `"0"`.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let unit_at = match text.find(|c: char| !c.is_ascii_digit()) {
        None => return text.parse().ok(),
        Some(0) => return None,
        Some(at) => at,
    };
    let (digits, unit) = text.split_at(unit_at);
    let unit = unit.trim();
    let base = unit
        .strip_suffix("iB")
        .or_else(|| unit.strip_suffix('B').filter(|u| !u.is_empty()))
        .unwrap_or(unit);
    let shift = match base {
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return None,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)?
        .checked_mul(1u64 << shift)
}

//! Scrubbing kept logs of secrets (pure). The JIT configuration a runner got is never in the
//! agent's hands at cleanup (it is not journalled), so secrets are found by their shape, line by
//! line: a line never grows a secret across lines except a PEM block, which [`Scrubber`]
//! follows from its `BEGIN` line to its `END` line. A line too long to hold whole is scrubbed
//! in pieces ([`Scrubber::piece`]), cut where no secret's shape is cut (`copy::cut_at`).
//!
//! What is replaced, each by a `[redacted …]` marker that says which rule fired:
//! - GitHub tokens: `ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_` followed by
//!   [`MIN_TOKEN_BODY`] or more token characters, and `github_pat_…`;
//! - JWTs: `eyJ…` with three dot-separated base64url segments (an App JWT, an OIDC token);
//! - PEM private keys: every line from `-----BEGIN … PRIVATE KEY-----` to its `END` line;
//! - the value of an `Authorization` header (`Authorization: Bearer …`, `"authorization": "…"`)
//!   to the end of the line;
//! - long base64 runs ([`MIN_BASE64_RUN`] characters or more), which is what an encoded JIT
//!   configuration (base64 of a JSON document of a kilobyte or more on GitHub) and the
//!   credentials inside it look like.

/// The shortest body after a `gh?_` prefix taken as a token: GitHub's are 36 characters and
/// more; a shorter one is a word like `ghs_path`.
pub(crate) const MIN_TOKEN_BODY: usize = 20;

/// The shortest run of base64 characters taken as an encoded secret. GitHub's encoded JIT
/// configuration is well over a kilobyte and each credential inside it (an RSA key's parameters,
/// a token) is over this; a SHA-256 in hex (64), a git object id (40), a UUID (36) and ordinary
/// words stay readable. A run with a `/` more often than one character in
/// [`PATH_SLASH_EVERY`] is a path, not base64, and is kept.
pub(crate) const MIN_BASE64_RUN: usize = 128;

/// See [`MIN_BASE64_RUN`]: base64 has a `/` once in 64 characters on average; a path far more.
pub(crate) const PATH_SLASH_EVERY: usize = 16;

/// The shortest first and second segment of a JWT (`eyJ` + the JSON header; the payload).
const MIN_JWT_SEGMENT: usize = 10;

const GITHUB_PREFIXES: [&[u8]; 5] = [b"ghp_", b"gho_", b"ghs_", b"ghu_", b"ghr_"];
const GITHUB_PAT: &[u8] = b"github_pat_";

/// A line-by-line scrubber; it remembers whether it is inside a PEM private key.
#[derive(Debug, Default, Clone)]
pub struct Scrubber {
    in_private_key: bool,
    /// The line being scrubbed in pieces had an `Authorization` value: its next pieces are
    /// that value too.
    in_authorization: bool,
}

impl Scrubber {
    /// The line (without its newline) with every secret replaced.
    pub fn line(&mut self, line: &[u8]) -> Vec<u8> {
        self.scrub(line).0
    }

    /// A piece of a line too long to be scrubbed whole (see `copy::MAX_PIECE`); `ends`: the
    /// line ends after it. An `Authorization` value goes on to the line's end, whatever
    /// pieces it is in; every other rule applies to each piece.
    pub fn piece(&mut self, piece: &[u8], ends: bool) -> Vec<u8> {
        if self.in_authorization {
            self.in_authorization = !ends;
            return Vec::new();
        }
        let (scrubbed, authorization) = self.scrub(piece);
        self.in_authorization = authorization && !ends;
        scrubbed
    }

    /// The line scrubbed, and whether an `Authorization` value was taken to its end.
    fn scrub(&mut self, line: &[u8]) -> (Vec<u8>, bool) {
        if self.in_private_key {
            if is_pem_boundary(line, b"-----END") {
                self.in_private_key = false;
            }
            return (b"[redacted private key line]".to_vec(), false);
        }
        if is_pem_boundary(line, b"-----BEGIN") {
            // A one-line block (BEGIN and END together) ends where it starts.
            self.in_private_key = !is_pem_boundary(line, b"-----END");
            return (b"[redacted private key]".to_vec(), false);
        }
        match authorization(line) {
            Some(line) => (scrub_words(&line), true),
            None => (scrub_words(line), false),
        }
    }

    /// A whole text: every line scrubbed, newlines kept (so line counts stay as they were).
    pub fn text(&mut self, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        let mut lines = text.split(|b| *b == b'\n').peekable();
        while let Some(line) = lines.next() {
            out.extend_from_slice(&self.line(line));
            if lines.peek().is_some() {
                out.push(b'\n');
            }
        }
        out
    }
}

/// Scrubs a whole text with a fresh [`Scrubber`].
pub fn scrub(text: &[u8]) -> Vec<u8> {
    Scrubber::default().text(text)
}

fn is_pem_boundary(line: &[u8], marker: &[u8]) -> bool {
    contains(line, marker) && contains(line, b"PRIVATE KEY-----")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle, 0).is_some()
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|at| at + from)
}

/// The line with an `Authorization` header's value taken to the end of the line (whatever
/// scheme it has, `Bearer`, `token`, `Basic`, it is a credential); `None` when it has none.
fn authorization(line: &[u8]) -> Option<Vec<u8>> {
    const NAME: &[u8] = b"authorization";
    // Where the name starts, in any case, without a lowered copy of a long line.
    let starts = (0..line.len().saturating_sub(NAME.len() - 1)).filter(|at| {
        line[*at].eq_ignore_ascii_case(&NAME[0])
            && line[*at..*at + NAME.len()].eq_ignore_ascii_case(NAME)
    });
    for at in starts {
        let mut i = at + NAME.len();
        // `Authorization:`, `"authorization": "…"`, `authorization=…`.
        while i < line.len() && matches!(line[i], b'"' | b'\'' | b' ' | b'\t') {
            i += 1;
        }
        if i < line.len() && matches!(line[i], b':' | b'=') {
            let mut out = line[..=i].to_vec();
            out.extend_from_slice(b" [redacted]");
            return Some(out);
        }
    }
    None
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_base64url_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn is_base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// Tokens, JWTs and long base64 runs, scanned left to right; what no rule takes is copied.
fn scrub_words(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        // A match only starts where a word starts: `xghp_…` is not a token's prefix.
        // Every shape starts with a base64 character: a run of anything else (a sparse
        // file's zeros) is copied without trying each rule at each byte.
        let boundary = is_base64_char(line[i]) && (i == 0 || !is_base64_char(line[i - 1]));
        if boundary && let Some((end, what)) = secret_at(line, i) {
            out.extend_from_slice(format!("[redacted {what}]").as_bytes());
            i = end;
            continue;
        }
        out.push(line[i]);
        i += 1;
    }
    out
}

/// The end of a secret starting at `i`, and what it is.
fn secret_at(line: &[u8], i: usize) -> Option<(usize, &'static str)> {
    let rest = &line[i..];
    for prefix in GITHUB_PREFIXES.iter().chain([&GITHUB_PAT]) {
        if rest.starts_with(prefix) {
            let body = run(rest, prefix.len(), is_token_char);
            if body - prefix.len() >= MIN_TOKEN_BODY {
                return Some((i + body, "github token"));
            }
        }
    }
    if rest.starts_with(b"eyJ")
        && let Some(end) = jwt(rest)
    {
        return Some((i + end, "jwt"));
    }
    let end = run(rest, 0, is_base64_char);
    // Padding belongs to the run.
    let padded = run(rest, end, |b| b == b'=');
    if end >= MIN_BASE64_RUN && looks_encoded(&rest[..end]) {
        return Some((i + padded, "base64"));
    }
    None
}

/// Where the run of `class` characters that starts at `from` ends.
fn run(bytes: &[u8], from: usize, class: impl Fn(u8) -> bool) -> usize {
    from + bytes[from..].iter().take_while(|b| class(**b)).count()
}

/// `header.payload.signature` in base64url; the end of the token.
fn jwt(rest: &[u8]) -> Option<usize> {
    let header = run(rest, 0, is_base64url_char);
    if header < MIN_JWT_SEGMENT || rest.get(header) != Some(&b'.') {
        return None;
    }
    let payload = run(rest, header + 1, is_base64url_char);
    if payload - header - 1 < MIN_JWT_SEGMENT || rest.get(payload) != Some(&b'.') {
        return None;
    }
    // The signature may be empty (an unsigned token is still a token's claims).
    Some(run(rest, payload + 1, is_base64url_char))
}

/// A long run is base64 unless it reads like a path (a `/` every few characters) or has no
/// mix of letters and digits.
fn looks_encoded(run: &[u8]) -> bool {
    let slashes = run.iter().filter(|b| **b == b'/').count();
    let upper = run.iter().any(u8::is_ascii_uppercase);
    let lower = run.iter().any(u8::is_ascii_lowercase);
    let digit = run.iter().any(u8::is_ascii_digit);
    slashes * PATH_SLASH_EVERY <= run.len() && upper && lower && digit
}

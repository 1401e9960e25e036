//! Container images made from the host's `busybox` for the Docker tests (never a pull): a root
//! filesystem as a tar (a `docker import` tarball, or an image's one layer), and `docker save`
//! output of one layer (what an operator puts in `policy.docker_images`). Shared by the host
//! tests (`agent/tests/host/runner_docker.rs`) and the end-to-end ones
//! (`tests/e2e/tests/run/docker.rs`).

use std::path::PathBuf;

/// Where `busybox-static` put it, if it is installed.
pub(crate) fn busybox() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// The image architecture of this machine, as Docker names it.
pub(crate) fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The SHA-256 of `bytes`, in lower-case hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A root filesystem: busybox, a link to it for each of `applets` in `/bin`, `page` as
/// `/www/index.html`, the usual empty directories, and with `padding` > 0 a file `/pad` of that
/// many incompressible bytes (so a gzip layer is as large as the plain one).
pub(crate) fn rootfs(applets: &[&str], page: &[u8], padding: usize) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for d in ["bin", "www", "tmp", "proc", "sys", "dev", "etc"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        // `/tmp` as every image has it: anyone may write, only the owner remove.
        header.set_mode(if d == "tmp" { 0o1777 } else { 0o755 });
        header.set_size(0);
        tar.append_data(&mut header, d, std::io::empty()).unwrap();
    }
    let file = |tar: &mut tar::Builder<Vec<u8>>, name: &str, mode: u32, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, name, bytes).unwrap();
    };
    let busybox = std::fs::read(busybox().expect("busybox is installed")).unwrap();
    file(&mut tar, "bin/busybox", 0o755, &busybox);
    for applet in applets {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        tar.append_link(&mut header, format!("bin/{applet}"), "busybox")
            .unwrap();
    }
    file(&mut tar, "www/index.html", 0o644, page);
    if padding > 0 {
        // xorshift: incompressible.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let pad: Vec<u8> = (0..padding / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        file(&mut tar, "pad", 0o644, &pad);
    }
    tar.into_inner().unwrap()
}

/// `docker save` output for one image of one layer (`layer`, a plain tar), tagged
/// `<tag>:latest`, written without a daemon.
pub(crate) fn saved_image(layer: &[u8], tag: &str) -> Vec<u8> {
    let config = serde_json::json!({
        "architecture": arch(),
        "os": "linux",
        "config": { "Env": ["PATH=/bin"], "Cmd": ["sh"] },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(layer))] },
    })
    .to_string()
    .into_bytes();
    let config_name = format!("{}.json", sha256_hex(&config));
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [format!("{tag}:latest")],
        "Layers": ["layer/layer.tar"],
    }])
    .to_string()
    .into_bytes();
    let mut tar = tar::Builder::new(Vec::new());
    let mut file = |name: &str, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, name, bytes).unwrap();
    };
    file("layer/layer.tar", layer);
    file(&config_name, &config);
    file("manifest.json", &manifest);
    tar.into_inner().unwrap()
}

use super::*;

#[test]
fn the_image_s_env_goes_over_the_host_s_but_never_over_what_rm_sets() {
    let env = vec![
        (OsString::from("HOME"), OsString::from("/rt/home")),
        (OsString::from("LANG"), OsString::from("C.UTF-8")),
        (OsString::from("PATH"), OsString::from("/host/bin")),
        (OsString::from("TMPDIR"), OsString::from("/rt/tmp")),
    ];
    let image = [
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), "/root".to_owned()),
        ("TMPDIR".to_owned(), "/var/tmp".to_owned()),
        ("RM_IMAGE".to_owned(), "no".to_owned()),
        ("JAVA_HOME".to_owned(), "/opt/java".to_owned()),
    ];
    let got: Vec<(String, String)> = with_image_env(env, &image)
        .into_iter()
        .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
        .collect();
    let want: Vec<(String, String)> = [
        ("HOME", "/rt/home"),
        ("JAVA_HOME", "/opt/java"),
        ("LANG", "C.UTF-8"),
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("TMPDIR", "/rt/tmp"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn overlay_options_name_the_three_directories_and_refuse_separators() {
    let dirs = RootDirs::of(Path::new("/var/lib/rm/runners/0123456789ab"));
    assert_eq!(
        overlay_options(Path::new("/var/lib/rm/images/abc/rootfs"), &dirs).unwrap(),
        "lowerdir=/var/lib/rm/images/abc/rootfs,\
         upperdir=/var/lib/rm/runners/0123456789ab/.rm-root/upper,\
         workdir=/var/lib/rm/runners/0123456789ab/.rm-root/work"
    );
    for bad in ["/images/a,b", "/images/a:b", "/images/a\\b"] {
        assert!(overlay_options(Path::new(bad), &dirs).is_err(), "{bad}");
    }
    let odd = RootDirs::of(Path::new("/runners:x/0123456789ab"));
    assert!(overlay_options(Path::new("/images/a"), &odd).is_err());
}

#[test]
fn the_runner_s_entry_replaces_one_of_the_same_name_or_id() {
    let image = "root:x:0:0:root:/root:/bin/sh\nrunner:x:1001:1001::/home/runner:/bin/bash\nold:x:64000:64000::/:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\n";
    let got = with_runner_entry(
        image,
        RUNNER_USER,
        64000,
        "runner:x:64000:64000:rm runner:/rt/home:/bin/sh",
    );
    assert_eq!(
        got,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\nrunner:x:64000:64000:rm runner:/rt/home:/bin/sh\n"
    );
    assert_eq!(
        with_runner_entry("", RUNNER_USER, 7, "runner:x:7:"),
        "runner:x:7:\n"
    );
}

#[test]
fn hosts_name_loopback_and_the_runner() {
    let hosts = hosts_file("rmr-0123456789ab");
    assert!(hosts.starts_with("127.0.0.1\tlocalhost\n"));
    assert!(hosts.contains("127.0.1.1\trmr-0123456789ab\n"));
}

#[test]
fn prepare_reads_the_image_s_accounts_inside_the_image_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    // An absolute link the image carries: inside the image it names the image's own file.
    std::fs::write(rootfs.join("etc/passwd.real"), "img:x:5:5::/:/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd.real", rootfs.join("etc/passwd")).unwrap();
    // A link out of the image: the host's /etc/group is never read.
    std::os::unix::fs::symlink("../../../../../../etc/hostname", rootfs.join("etc/group")).unwrap();
    let runtime = tmp.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let plan = ImagePlan {
        id: "sha256:00".into(),
        rootfs: rootfs.clone(),
        env: vec![],
    };
    let account = Account {
        uid: 64010,
        gid: 64010,
    };
    prepare(
        &runtime,
        &plan,
        account,
        "rmr-x",
        Some(b"nameserver 10.0.0.1\n"),
    )
    .unwrap();
    let etc = runtime.join(IMAGE_ROOT_DIR).join("upper/etc");
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    assert!(
        passwd.starts_with("img:x:5:5::/:/bin/sh\nrunner:x:64010:64010:"),
        "{passwd}"
    );
    let group = std::fs::read_to_string(etc.join("group")).unwrap();
    assert_eq!(
        group, "runner:x:64010:\n",
        "the host's file was not read through the link"
    );
    assert_eq!(
        std::fs::read(etc.join("resolv.conf")).unwrap(),
        b"nameserver 10.0.0.1\n"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&runtime.join(IMAGE_ROOT_DIR)), 0o700);
    // Prepared again (a slot's next runner): made anew, nothing of the last upper kept.
    std::fs::write(runtime.join(IMAGE_ROOT_DIR).join("upper/left"), "x").unwrap();
    prepare(&runtime, &plan, account, "rmr-x", None).unwrap();
    assert!(!runtime.join(IMAGE_ROOT_DIR).join("upper/left").exists());
    assert!(!etc.join("resolv.conf").exists());
}

//! Tests of the fitness check: packages of hand-built ELF files in fake images (links inside
//! the root, the loader's configuration, libraries found in the package, transitive needs,
//! candidates of another architecture), and real binaries (the host's `/bin/ls`, the fake
//! runner cargo builds, a fake .NET runtime) in the host's root, an empty root and small roots
//! made of copies of the host's libraries.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::elf::tests::build;
use super::elf::{Class, Endian};
use super::*;

const INTERP: &str = "/lib64/ld-linux-x86-64.so.2";

/// Writes a hand-built x86-64 ELF file at `path` (parents created).
fn write_elf(
    path: &Path,
    class: Class,
    interp: Option<&str>,
    needed: &[&str],
    runpath: Option<&str>,
) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        build(class, Endian::Little, interp, needed, runpath).bytes,
    )
    .unwrap();
}

fn lib(path: &Path, needed: &[&str]) {
    write_elf(path, Class::Elf64, None, needed, None);
}

/// The `what`s of a report's missing pieces, with what needs each.
fn missing(report: &FitReport) -> Vec<(String, String)> {
    report
        .missing
        .iter()
        .map(|m| (m.what.clone(), m.needed_by.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// A merged-usr fake image: `/lib -> usr/lib`, the loader at `/lib64/...` as an absolute link
/// into `/lib/x86_64-linux-gnu`, libc there, and `/opt/foo/lib` named by an included
/// configuration file.
fn fake_image(root: &Path) {
    std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
    std::fs::create_dir_all(root.join("lib64")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    lib(
        &root.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        &[],
    );
    symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    lib(
        &root.join("usr/lib/x86_64-linux-gnu/libc.so.6"),
        &["ld-linux-x86-64.so.2"],
    );
    lib(
        &root.join("opt/foo/lib/libfoo.so.1"),
        &["libbar.so.2", "libc.so.6"],
    );
    std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/ld.so.conf.d/foo.conf"), "/opt/foo/lib\n").unwrap();
}

#[test]
fn a_package_in_a_fake_image_names_what_is_missing_then_is_fit() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    fake_image(root);
    write_elf(
        &pkg.join("bin/Runner.Listener"),
        Class::Elf64,
        Some(INTERP),
        &["libfoo.so.1", "libpkg.so", "libc.so.6"],
        None,
    );
    // Found beside the file that needs it; it finds its own library through $ORIGIN, outside
    // bin/, whose needs are checked too.
    write_elf(
        &pkg.join("bin/libpkg.so"),
        Class::Elf64,
        None,
        &["libc.so.6", "libpriv.so"],
        Some("$ORIGIN/../lib"),
    );
    lib(&pkg.join("lib/libpriv.so"), &["libc.so.6", "libgone.so.9"]);
    std::fs::write(pkg.join("bin/Runner.Listener.dll"), b"MZ not an ELF file").unwrap();
    std::fs::write(
        pkg.join("bin/broken.so"),
        b"\x7fELF\x02\x01\x01 and then nothing",
    )
    .unwrap();

    let report = check(root, pkg);
    assert_eq!(
        missing(&report),
        pairs(&[
            ("libbar.so.2", "/opt/foo/lib/libfoo.so.1 in the image"),
            ("libgone.so.9", "lib/libpriv.so"),
        ]),
        "{report}"
    );
    assert!(!report.is_fit());
    assert!(report.optional.is_empty(), "{report}");
    assert_eq!(report.notes.len(), 1, "{report}");
    assert!(
        report.notes[0].starts_with("bin/broken.so: not an ELF we can read"),
        "{report}"
    );
    // Runner.Listener, libpkg.so, libpriv.so, libfoo, libc, the loader (libc needs it).
    assert_eq!(report.examined, 6, "{report}");
    let text = report.to_string();
    assert!(
        text.starts_with("the image cannot run the runner package: 2 pieces are missing"),
        "{text}"
    );
    assert!(text.contains("the image lacks libbar.so.2, needed by /opt/foo/lib/libfoo.so.1 in the image: install the package that provides libbar.so.2"), "{text}");

    lib(&root.join("usr/lib/libbar.so.2"), &["libc.so.6"]);
    lib(&pkg.join("lib/libgone.so.9"), &[]);
    let report = check(root, pkg);
    assert!(report.is_fit(), "{report}");
    assert_eq!(report.examined, 8, "{report}");
    assert!(
        report
            .to_string()
            .starts_with("the image can run the runner package (8 ELF files examined)"),
        "{report}"
    );
}

#[test]
fn links_at_the_hosts_libraries_do_not_satisfy_the_image() {
    // The host has these; the image only links at them by absolute path.
    let host_loader = Path::new("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    let host_libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    assert!(
        host_loader.is_file() && host_libc.is_file(),
        "the host (x86-64 Debian) has its loader and libc"
    );
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    std::fs::create_dir_all(root.join("lib64")).unwrap();
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    symlink(host_loader, root.join("lib64/ld-linux-x86-64.so.2")).unwrap();
    symlink(host_libc, root.join("lib64/libc.so.6")).unwrap();
    symlink(
        "../../../../../../lib/x86_64-linux-gnu/libc.so.6",
        root.join("usr/lib/libc.so.6"),
    )
    .unwrap();
    write_elf(
        &pkg.join("bin/Runner.Listener"),
        Class::Elf64,
        Some(INTERP),
        &["libc.so.6"],
        None,
    );
    let report = check(root, pkg);
    assert_eq!(
        missing(&report),
        pairs(&[
            (INTERP, "bin/Runner.Listener (its ELF interpreter)"),
            ("libc.so.6", "bin/Runner.Listener"),
        ]),
        "{report}"
    );
}

#[test]
fn a_library_of_another_class_is_passed_over_as_the_loader_does() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    write_elf(
        &root.join("usr/lib/x86_64-linux-gnu/libx.so.1"),
        Class::Elf32,
        None,
        &[],
        None,
    );
    write_elf(
        &pkg.join("bin/tool"),
        Class::Elf64,
        None,
        &["libx.so.1"],
        None,
    );
    assert_eq!(
        missing(&check(root, pkg)),
        pairs(&[("libx.so.1", "bin/tool")])
    );
    // A 64-bit one later in the search order is the one loaded.
    lib(&root.join("usr/lib/libx.so.1"), &[]);
    let report = check(root, pkg);
    assert!(report.is_fit(), "{report}");
}

#[test]
fn externals_node_is_checked_but_not_the_alpine_one() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    fake_image(root);
    write_elf(
        &pkg.join("bin/Runner.Listener"),
        Class::Elf64,
        Some(INTERP),
        &["libc.so.6"],
        None,
    );
    write_elf(
        &pkg.join("externals/node20/bin/node"),
        Class::Elf64,
        Some(INTERP),
        &["libc.so.6", "libstdc++.so.6"],
        None,
    );
    write_elf(
        &pkg.join("externals/node20_alpine/bin/node"),
        Class::Elf64,
        Some("/lib/ld-musl-x86_64.so.1"),
        &["libc.musl-x86_64.so.1"],
        None,
    );
    // Not a node: not run by the runner, not checked.
    write_elf(
        &pkg.join("externals/git/bin/git"),
        Class::Elf64,
        Some(INTERP),
        &["libpcre9.so"],
        None,
    );
    let report = check(root, pkg);
    assert_eq!(
        missing(&report),
        pairs(&[("libstdc++.so.6", "externals/node20/bin/node")]),
        "{report}"
    );
    assert_eq!(
        report.missing[0].fix,
        "install libstdc++6 in the image (Debian/Ubuntu)"
    );
}

#[test]
fn the_tracepoint_providers_needs_are_optional() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    fake_image(root);
    lib(
        &pkg.join("bin/libcoreclrtraceptprovider.so"),
        &["liblttng-ust.so.0", "libc.so.6"],
    );
    let report = check(root, pkg);
    assert!(report.is_fit(), "{report}");
    assert_eq!(report.optional.len(), 1, "{report}");
    assert_eq!(report.optional[0].what, "liblttng-ust.so.0");
    assert!(
        report.to_string().contains(
            "optional (the runner runs without them):\n  - the image lacks liblttng-ust.so.0"
        ),
        "{report}"
    );
}

#[test]
fn what_a_required_file_lacks_is_not_also_listed_as_optional() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    fake_image(root);
    lib(
        &pkg.join("bin/libcoreclrtraceptprovider.so"),
        &["liblttng-ust.so.0"],
    );
    lib(&pkg.join("bin/libtrace.so"), &["liblttng-ust.so.0"]);
    let report = check(root, pkg);
    assert_eq!(
        missing(&report),
        pairs(&[("liblttng-ust.so.0", "bin/libtrace.so")]),
        "{report}"
    );
    assert!(report.optional.is_empty(), "{report}");
}

#[test]
fn an_image_librarys_origin_is_its_directory_in_the_image() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let (root, pkg) = (image.path(), package.path());
    fake_image(root);
    lib(&root.join("usr/lib/libbar.so.2"), &[]);
    write_elf(
        &root.join("opt/foo/lib/libfoo.so.1"),
        Class::Elf64,
        None,
        &["libp.so"],
        Some("$ORIGIN/../private"),
    );
    lib(&pkg.join("bin/tool"), &["libfoo.so.1"]);
    assert_eq!(
        missing(&check(root, pkg)),
        pairs(&[("libp.so", "/opt/foo/lib/libfoo.so.1 in the image")])
    );
    lib(&root.join("opt/foo/private/libp.so"), &[]);
    let report = check(root, pkg);
    assert!(report.is_fit(), "{report}");
}

#[test]
fn objects_the_loader_does_not_run_are_not_examined() {
    let image = tempfile::tempdir().unwrap();
    let package = tempfile::tempdir().unwrap();
    let mut object = build(Class::Elf64, Endian::Little, None, &["libnothere.so"], None).bytes;
    object[16] = 1; // ET_REL: a .o file
    std::fs::create_dir_all(package.path().join("bin")).unwrap();
    std::fs::write(package.path().join("bin/thing.o"), object).unwrap();
    let report = check(image.path(), package.path());
    assert!(report.is_fit(), "{report}");
    assert_eq!(report.examined, 0);
}

#[test]
fn an_unreadable_root_is_unfit() {
    let package = tempfile::tempdir().unwrap();
    let report = check(Path::new("/nonexistent/rootfs"), package.path());
    assert!(!report.is_fit());
    assert!(
        report
            .to_string()
            .contains("a readable root (/nonexistent/rootfs)"),
        "{report}"
    );
}

#[test]
fn needed_by_names_a_few_then_counts() {
    let names = |n: usize| (1..=n).map(|i| format!("f{i}")).collect::<Vec<_>>();
    let cases = [
        (0, ""),
        (1, "f1"),
        (2, "f1 and f2"),
        (3, "f1, f2 and f3"),
        (4, "f1, f2, f3 and 1 more"),
        (10, "f1, f2, f3 and 7 more"),
    ];
    for (n, want) in cases {
        assert_eq!(name_list(&names(n)), want, "{n}");
    }
}

#[test]
fn the_message_names_every_missing_piece_its_fix_and_the_notes() {
    let report = FitReport {
        missing: vec![
            Missing {
                what: "libc.so.6".into(),
                needed_by: "bin/a and bin/b".into(),
                fix: library_fix("libc.so.6"),
            },
            Missing {
                what: "libwhat.so.3".into(),
                needed_by: "bin/c".into(),
                fix: library_fix("libwhat.so.3"),
            },
        ],
        optional: vec![],
        notes: vec!["bin/d: not an ELF we can read: x: skipped".into()],
        examined: 3,
    };
    assert_eq!(
        report.to_string(),
        "the image cannot run the runner package: 2 pieces are missing\n  \
         - the image lacks libc.so.6, needed by bin/a and bin/b: install libc6 in the image (Debian/Ubuntu)\n  \
         - the image lacks libwhat.so.3, needed by bin/c: install the package that provides libwhat.so.3 in the image \
         (on Debian/Ubuntu `dpkg -S libwhat.so.3` on a machine that has it names the package)\n\
         notes:\n  - bin/d: not an ELF we can read: x: skipped"
    );
}

// ---- Real binaries ----

/// The host's architecture, as its `/bin/ls` is built.
fn host_arch() -> Arch {
    elf::parse(&File::open("/bin/ls").unwrap()).unwrap().arch
}

/// The host's library named `name`, where its loader would find it (absent: None).
fn host_library(name: &str) -> Option<PathBuf> {
    root::search_dirs(host_arch(), &[])
        .into_iter()
        .map(|d| Path::new(&d).join(name))
        .find(|p| p.is_file())
}

/// The host's libraries matching `pattern` in its multiarch directory.
fn host_libraries(pattern: &str) -> Vec<String> {
    let triplet = root::multiarch_triplets(host_arch())[0];
    let mut names: Vec<String> = std::fs::read_dir(format!("/usr/lib/{triplet}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| root::glob_match(pattern, n))
        .collect();
    names.sort();
    names
}

/// Copies the host's libraries `names`, and what they need in turn, into the image at `root`
/// (in `/usr/lib/<triplet>`; the files, not their links).
fn copy_host_libraries(root: &Path, names: &[String]) {
    let triplet = root::multiarch_triplets(host_arch())[0];
    let dir = root.join("usr/lib").join(triplet);
    std::fs::create_dir_all(&dir).unwrap();
    let mut todo: Vec<String> = names.to_vec();
    while let Some(name) = todo.pop() {
        let to = dir.join(&name);
        if to.exists() {
            continue;
        }
        let from = host_library(&name).unwrap_or_else(|| panic!("the host has no {name}"));
        std::fs::copy(&from, &to).unwrap();
        todo.extend(elf::parse(&File::open(&from).unwrap()).unwrap().needed);
    }
}

/// A small merged-usr image holding copies of the host's libraries that `programs` need (and
/// their loader, reached through an absolute link as Debian has it).
fn host_copy_image(root: &Path, programs: &[&Path]) {
    symlink("usr/lib", root.join("lib")).unwrap();
    let triplet = root::multiarch_triplets(host_arch())[0];
    for program in programs {
        let elf = elf::parse(&File::open(program).unwrap()).unwrap();
        let mut names = elf.needed.clone();
        if let Some(interp) = &elf.interpreter {
            let (dir, name) = interp.rsplit_once('/').unwrap();
            names.push(name.to_owned());
            let link = root.join(dir.trim_start_matches('/')).join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::fs::create_dir_all(link.parent().unwrap()).unwrap();
                symlink(format!("/lib/{triplet}/{name}"), &link).unwrap();
            }
        }
        copy_host_libraries(root, &names);
    }
}

/// A package whose `bin/<name>` is a copy of `from`.
fn package_with(dir: &Path, name: &str, from: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(from, dir.join("bin").join(name)).unwrap();
    dir.to_owned()
}

#[test]
fn the_hosts_ls_fits_the_host_and_not_an_empty_image() {
    let package = tempfile::tempdir().unwrap();
    let pkg = package_with(package.path(), "ls", Path::new("/bin/ls"));
    let report = check(Path::new("/"), &pkg);
    assert!(report.is_fit(), "{report}");
    assert!(
        report.examined >= 3,
        "ls, its libc and the loader at least: {report}"
    );

    let empty = tempfile::tempdir().unwrap();
    let report = check(empty.path(), &pkg);
    let whats: Vec<&str> = report.missing.iter().map(|m| m.what.as_str()).collect();
    assert!(whats.iter().any(|w| w.contains("ld-linux")), "{report}");
    assert!(whats.contains(&"libc.so.6"), "{report}");
    assert!(
        report
            .missing
            .iter()
            .all(|m| m.needed_by.starts_with("bin/ls")),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("the image lacks libc.so.6, needed by bin/ls: install libc6"),
        "{text}"
    );
    assert!(
        text.contains("(its ELF interpreter): use an image with glibc built for x86-64"),
        "{text}"
    );
}

/// The fake runner's binary: beside the test binary's directory when cargo built it (a
/// workspace build), else built here (cargo builds no binary of a package this one does not
/// depend on).
fn fake_runner() -> PathBuf {
    const NAME: &str = "rm-fake-runner";
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap().to_owned();
    let binary = profile.join(NAME);
    if !binary.is_file() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args([
                "build",
                "--quiet",
                "-p",
                NAME,
                "--bin",
                NAME,
                "--manifest-path",
            ])
            .arg(manifest);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "cannot build {NAME}");
    }
    assert!(binary.is_file(), "{} was not built", binary.display());
    binary
}

#[test]
fn the_fake_runner_fits_an_image_of_its_libraries_and_not_one_without_libc() {
    let runner = fake_runner();
    let package = tempfile::tempdir().unwrap();
    let pkg = package_with(package.path(), "Runner.Listener", &runner);
    assert!(check(Path::new("/"), &pkg).is_fit());

    let image = tempfile::tempdir().unwrap();
    host_copy_image(image.path(), &[&runner]);
    let report = check(image.path(), &pkg);
    assert!(report.is_fit(), "{report}");
    assert!(report.notes.is_empty(), "{report}");

    let triplet = root::multiarch_triplets(host_arch())[0];
    std::fs::remove_file(image.path().join("usr/lib").join(triplet).join("libc.so.6")).unwrap();
    let report = check(image.path(), &pkg);
    assert_eq!(report.missing.len(), 1, "{report}");
    assert_eq!(report.missing[0].what, "libc.so.6");
    assert!(
        report.missing[0]
            .needed_by
            .starts_with("bin/Runner.Listener"),
        "{report}"
    );
}

#[test]
fn a_dotnet_runner_needs_icu_and_says_so() {
    // A fake .NET runtime: any small host library named bin/libcoreclr.so.
    let zlib = host_library("libz.so.1").expect("the host has zlib");
    let package = tempfile::tempdir().unwrap();
    let pkg = package_with(package.path(), "libcoreclr.so", &zlib);
    let image = tempfile::tempdir().unwrap();
    let root = image.path();
    host_copy_image(root, &[&zlib]);
    copy_host_libraries(
        root,
        &[
            "libssl.so.3".into(),
            "libgssapi_krb5.so.2".into(),
            "libz.so.1".into(),
        ],
    );

    let report = check(root, &pkg);
    let needed_by = "the runner's .NET runtime (bin/libcoreclr.so)";
    assert_eq!(
        missing(&report),
        pairs(&[("libicuuc.so.*", needed_by), ("libicui18n.so.*", needed_by)]),
        "{report}"
    );
    assert!(
        report.missing[0].fix.contains("libicu72 on Debian 12"),
        "{report}"
    );
    assert!(
        report
            .optional
            .iter()
            .any(|m| m.what == "liblttng-ust.so.*"),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("the image lacks libicuuc.so.*, needed by the runner's .NET runtime (bin/libcoreclr.so): install ICU in the image"),
        "{text}"
    );

    // ICU's common library alone: its data library, which it needs, is named as missing.
    let icuuc = host_libraries("libicuuc.so.*");
    let icudata = host_libraries("libicudata.so.*");
    assert!(!icuuc.is_empty() && !icudata.is_empty(), "the host has ICU");
    let triplet = root::multiarch_triplets(host_arch())[0];
    let uc = &icuuc[0];
    std::fs::copy(
        host_library(uc).unwrap(),
        root.join("usr/lib").join(triplet).join(uc),
    )
    .unwrap();
    let report = check(root, &pkg);
    let whats: Vec<&str> = report.missing.iter().map(|m| m.what.as_str()).collect();
    assert!(whats.contains(&"libicui18n.so.*"), "{report}");
    assert!(!whats.contains(&"libicuuc.so.*"), "{report}");
    let data = report
        .missing
        .iter()
        .find(|m| m.what.starts_with("libicudata.so."))
        .unwrap_or_else(|| panic!("{report}"));
    // Found through /lib, the link to usr/lib, searched first as glibc does.
    assert_eq!(data.needed_by, format!("/lib/{triplet}/{uc} in the image"));

    // All of ICU: fit (LTTng still optional).
    copy_host_libraries(
        root,
        &[
            host_libraries("libicuuc.so.*"),
            host_libraries("libicui18n.so.*"),
        ]
        .concat(),
    );
    let report = check(root, &pkg);
    assert!(report.is_fit(), "{report}");
    assert!(!report.optional.is_empty(), "{report}");
}

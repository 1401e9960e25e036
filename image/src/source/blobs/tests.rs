use super::*;

#[test]
fn member_names_are_normalised_and_never_leave_the_root() {
    let cases = [
        ("index.json", Some("index.json")),
        ("./index.json", Some("index.json")),
        ("/blobs//sha256/./ab", Some("blobs/sha256/ab")),
        ("a/b/../c", Some("a/c")),
        ("a/../../c", None),
        ("..", None),
        ("./", None),
        ("", None),
    ];
    for (name, want) in cases {
        assert_eq!(normalise(name).as_deref(), want, "{name:?}");
    }
}

#[test]
fn links_are_followed_a_bounded_number_of_times() {
    let mut members = HashMap::new();
    members.insert(
        "a/layer.tar".to_owned(),
        Member::File {
            offset: 512,
            size: 7,
        },
    );
    members.insert(
        "b/layer.tar".to_owned(),
        Member::Link("a/layer.tar".to_owned()),
    );
    members.insert("loop1".to_owned(), Member::Link("loop2".to_owned()));
    members.insert("loop2".to_owned(), Member::Link("loop1".to_owned()));
    let index = TarIndex {
        file: PathBuf::from("/x.tar"),
        members,
    };
    assert_eq!(index.find("./b/layer.tar"), Some((512, 7)));
    assert_eq!(index.find("a/layer.tar"), Some((512, 7)));
    assert_eq!(index.find("loop1"), None);
    assert_eq!(index.find("c"), None);
}

#[test]
fn an_archive_is_indexed_and_read_without_extracting_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.tar");
    let mut builder = tar::Builder::new(File::create(&path).expect("create"));
    let mut add = |name: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(EntryType::Regular);
        builder
            .append_data(&mut header, name, data)
            .expect("append");
    };
    add("./index.json", b"{}");
    // A long name takes a GNU long-name header before it.
    let long = format!("blobs/sha256/{}", "f".repeat(120));
    add(&long, b"long member");
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(EntryType::Symlink);
    link.set_size(0);
    builder
        .append_link(&mut link, "blobs/alias", "sha256/../../index.json")
        .expect("link");
    builder.into_inner().expect("finish");

    let blobs = Blobs::Tar(TarIndex::build(&path).expect("index"));
    assert_eq!(blobs.read_bounded("index.json", 2).expect("read"), b"{}");
    assert_eq!(blobs.read_bounded("blobs/alias", 2).expect("read"), b"{}");
    assert_eq!(
        blobs.read_bounded(&long, 100).expect("read"),
        b"long member"
    );
    assert!(matches!(
        blobs.read_bounded(&long, 3),
        Err(SourceError::TooLarge { limit: 3, .. })
    ));
    assert!(matches!(
        blobs.open("nothing"),
        Err(SourceError::Missing { what }) if what.contains("member nothing")
    ));
}

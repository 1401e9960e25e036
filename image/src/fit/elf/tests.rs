//! Table tests of the ELF reader on hand-built files: good ones of every class and byte order,
//! truncated ones, and ones whose offsets lie.

use super::*;

/// The address the test files' one `PT_LOAD` segment is loaded at.
const BASE: u64 = 0x10000;

/// Where the pieces of a built file sit, so a test can corrupt one.
pub(crate) struct Built {
    pub(crate) bytes: Vec<u8>,
    phoff: usize,
    strtab: usize,
    dynamic: usize,
}

/// Builds an ELF file: header, three program headers (`PT_LOAD` of the whole file at
/// [`BASE`], `PT_INTERP`, `PT_DYNAMIC`), the interpreter, the string table, the dynamic
/// section.
pub(crate) fn build(
    class: Class,
    endian: Endian,
    interp: Option<&str>,
    needed: &[&str],
    runpath: Option<&str>,
) -> Built {
    let (header_len, ph_len, word) = match class {
        Class::Elf32 => (52usize, 32usize, 4usize),
        Class::Elf64 => (64, 56, 8),
    };
    let put = |buf: &mut Vec<u8>, at: usize, value: u64, len: usize| {
        let bytes = match endian {
            Endian::Little => value.to_le_bytes()[..len].to_vec(),
            Endian::Big => value.to_be_bytes()[8 - len..].to_vec(),
        };
        buf[at..at + len].copy_from_slice(&bytes);
    };
    let phoff = header_len;
    let interp_at = phoff + 3 * ph_len;
    let interp_bytes: Vec<u8> = interp
        .map(|i| [i.as_bytes(), &[0]].concat())
        .unwrap_or_default();
    let strtab = interp_at + interp_bytes.len();
    let mut strings = vec![0u8];
    let mut name_at = Vec::new();
    for n in needed {
        name_at.push(strings.len() as u64);
        strings.extend_from_slice(n.as_bytes());
        strings.push(0);
    }
    let runpath_at = runpath.map(|p| {
        let at = strings.len() as u64;
        strings.extend_from_slice(p.as_bytes());
        strings.push(0);
        at
    });
    let dynamic = (strtab + strings.len()).next_multiple_of(8);
    let mut entries: Vec<(u64, u64)> = name_at.iter().map(|&at| (DT_NEEDED, at)).collect();
    entries.push((DT_STRTAB, BASE + strtab as u64));
    entries.push((DT_STRSZ, strings.len() as u64));
    if let Some(at) = runpath_at {
        entries.push((DT_RUNPATH, at));
    }
    entries.push((DT_NULL, 0));
    let total = dynamic + entries.len() * 2 * word;
    let mut b = vec![0u8; total];
    b[..4].copy_from_slice(&ELF_MAGIC);
    b[4] = if class == Class::Elf32 { 1 } else { 2 };
    b[5] = if endian == Endian::Little { 1 } else { 2 };
    b[6] = 1;
    put(&mut b, 16, u64::from(ET_DYN), 2);
    put(&mut b, 18, 62, 2);
    let (phoff_at, phentsize_at, phnum_at) = match class {
        Class::Elf32 => (28, 42, 44),
        Class::Elf64 => (32, 54, 56),
    };
    put(&mut b, phoff_at, phoff as u64, word);
    put(&mut b, phentsize_at, ph_len as u64, 2);
    put(&mut b, phnum_at, if interp.is_some() { 3 } else { 2 }, 2);
    let mut segments = vec![(PT_LOAD, 0u64, BASE, total as u64)];
    if interp.is_some() {
        segments.push((
            PT_INTERP,
            interp_at as u64,
            BASE + interp_at as u64,
            interp_bytes.len() as u64,
        ));
    }
    segments.push((
        PT_DYNAMIC,
        dynamic as u64,
        BASE + dynamic as u64,
        (entries.len() * 2 * word) as u64,
    ));
    for (i, (kind, offset, vaddr, filesz)) in segments.into_iter().enumerate() {
        let h = phoff + i * ph_len;
        put(&mut b, h, u64::from(kind), 4);
        match class {
            Class::Elf32 => {
                put(&mut b, h + 4, offset, 4);
                put(&mut b, h + 8, vaddr, 4);
                put(&mut b, h + 16, filesz, 4);
            }
            Class::Elf64 => {
                put(&mut b, h + 8, offset, 8);
                put(&mut b, h + 16, vaddr, 8);
                put(&mut b, h + 32, filesz, 8);
            }
        }
    }
    b[interp_at..interp_at + interp_bytes.len()].copy_from_slice(&interp_bytes);
    b[strtab..strtab + strings.len()].copy_from_slice(&strings);
    for (i, (tag, value)) in entries.into_iter().enumerate() {
        put(&mut b, dynamic + i * 2 * word, tag, word);
        put(&mut b, dynamic + i * 2 * word + word, value, word);
    }
    Built {
        bytes: b,
        phoff,
        strtab,
        dynamic,
    }
}

fn typical(class: Class, endian: Endian) -> Built {
    build(
        class,
        endian,
        Some("/lib64/ld-linux-x86-64.so.2"),
        &["libstdc++.so.6", "libc.so.6"],
        Some("$ORIGIN:/opt/x/lib"),
    )
}

#[test]
fn good_files_of_every_class_and_byte_order() {
    for class in [Class::Elf32, Class::Elf64] {
        for endian in [Endian::Little, Endian::Big] {
            let built = typical(class, endian);
            let elf = parse(built.bytes.as_slice()).unwrap();
            assert_eq!(
                elf.arch,
                Arch {
                    class,
                    endian,
                    machine: 62
                },
                "{class:?} {endian:?}"
            );
            assert_eq!(elf.kind, ET_DYN);
            assert_eq!(
                elf.interpreter.as_deref(),
                Some("/lib64/ld-linux-x86-64.so.2")
            );
            assert_eq!(elf.needed, ["libstdc++.so.6", "libc.so.6"]);
            assert_eq!(elf.runpath, ["$ORIGIN", "/opt/x/lib"]);
            assert!(elf.rpath.is_empty());
            assert_eq!(elf.search_path(), ["$ORIGIN", "/opt/x/lib"]);
        }
    }
}

#[test]
fn a_static_file_and_one_without_interpreter() {
    let none = build(Class::Elf64, Endian::Little, None, &[], None);
    let elf = parse(none.bytes.as_slice()).unwrap();
    assert_eq!(elf.interpreter, None);
    assert!(elf.needed.is_empty());
    let lib = build(Class::Elf64, Endian::Little, None, &["libm.so.6"], None);
    assert_eq!(parse(lib.bytes.as_slice()).unwrap().needed, ["libm.so.6"]);
}

#[test]
fn not_elf_files_are_told_apart_from_malformed_ones() {
    let cases: &[(&[u8], bool)] = &[
        (b"", true),
        (b"\x7fEL", true),
        (b"#!/bin/sh\necho hi\n", true),
        (b"MZ\x90\x00 a .dll", true),
        (b"\x7fELF", false),
        (b"\x7fELF\x03\x01\x01", false),
    ];
    for (bytes, not_elf) in cases {
        let got = parse(*bytes);
        if *not_elf {
            assert_eq!(got, Err(ElfError::NotElf), "{bytes:?}");
        } else {
            assert!(
                matches!(got, Err(ElfError::Malformed(_))),
                "{bytes:?}: {got:?}"
            );
        }
    }
}

#[test]
fn every_truncation_is_malformed_never_a_panic() {
    for class in [Class::Elf32, Class::Elf64] {
        for endian in [Endian::Little, Endian::Big] {
            let built = typical(class, endian);
            for len in 4..built.bytes.len() {
                let got = parse(&built.bytes[..len]);
                assert!(
                    matches!(got, Err(ElfError::Malformed(_))),
                    "{class:?} {endian:?} cut at {len}: {got:?}"
                );
            }
        }
    }
}

/// Sets the 64-bit little-endian word at `at`.
fn set64(b: &mut [u8], at: usize, value: u64) {
    b[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn lying_offsets_are_malformed() {
    let dyn_entry = |i: usize| typical(Class::Elf64, Endian::Little).dynamic + i * 16;
    type Corrupt = Box<dyn Fn(&mut Built)>;
    let cases: Vec<(&str, Corrupt, &str)> = vec![
        (
            "phoff past the end",
            Box::new(|b| set64(&mut b.bytes, 32, 1 << 40)),
            "past the end",
        ),
        (
            "phoff overflowing",
            Box::new(|b| set64(&mut b.bytes, 32, u64::MAX - 8)),
            "overflows",
        ),
        (
            "phnum = PN_XNUM",
            Box::new(|b| b.bytes[56..58].copy_from_slice(&[0xff, 0xff])),
            "program headers",
        ),
        (
            "phentsize too small",
            Box::new(|b| b.bytes[54..56].copy_from_slice(&[8, 0])),
            "less than",
        ),
        (
            "the interpreter's offset past the end",
            Box::new(|b| {
                let at = b.phoff + 56 + 8;
                set64(&mut b.bytes, at, 1 << 33);
            }),
            "past the end",
        ),
        (
            "the dynamic section past the end",
            Box::new(|b| {
                let at = b.phoff + 2 * 56 + 8;
                set64(&mut b.bytes, at, 1 << 33);
            }),
            "past the end",
        ),
        (
            "DT_STRTAB outside every PT_LOAD",
            Box::new(move |b| set64(&mut b.bytes, dyn_entry(2) + 8, 0x1)),
            "no loaded segment",
        ),
        (
            "a needed name beyond DT_STRSZ",
            Box::new(move |b| set64(&mut b.bytes, dyn_entry(0) + 8, 10_000)),
            "outside the string table",
        ),
        (
            "no DT_NULL",
            Box::new(move |b| {
                let last = dyn_entry(5);
                set64(&mut b.bytes, last, 0x6fff_fff0);
            }),
            "no DT_NULL",
        ),
        (
            "a name without its NUL",
            Box::new(|b| {
                // DT_STRSZ cut to end inside the first name.
                let strsz = typical(Class::Elf64, Endian::Little).dynamic + 3 * 16 + 8;
                set64(&mut b.bytes, strsz, 4);
            }),
            "no NUL",
        ),
        (
            "a name that is not UTF-8",
            Box::new(|b| {
                let at = b.strtab + 1;
                b.bytes[at] = 0xff;
            }),
            "not UTF-8",
        ),
        ("an unknown class", Box::new(|b| b.bytes[4] = 7), "class"),
        (
            "an unknown byte order",
            Box::new(|b| b.bytes[5] = 0),
            "byte order",
        ),
        (
            "an unknown version",
            Box::new(|b| b.bytes[6] = 2),
            "version",
        ),
    ];
    for (name, corrupt, expect) in cases {
        let mut built = typical(Class::Elf64, Endian::Little);
        assert!(
            parse(built.bytes.as_slice()).is_ok(),
            "{name}: the uncorrupted file parses"
        );
        corrupt(&mut built);
        match parse(built.bytes.as_slice()) {
            Err(ElfError::Malformed(why)) => assert!(why.contains(expect), "{name}: {why}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn a_dynamic_section_without_end_is_read_no_further_than_its_bound() {
    // 2 MiB of entries and no DT_NULL: MAX_DYNAMIC_ENTRIES are read, then it is malformed.
    let mut built = typical(Class::Elf64, Endian::Little);
    let filesz_at = built.phoff + 2 * 56 + 32;
    let dynamic = built.dynamic;
    built.bytes.truncate(dynamic + 5 * 16);
    built.bytes.resize(dynamic + (2 << 20), 0x11);
    set64(&mut built.bytes, filesz_at, 2 << 20);
    let counting = Counting {
        inner: built.bytes.as_slice(),
        read: std::cell::Cell::new(0),
    };
    match parse(&counting) {
        Err(ElfError::Malformed(why)) => assert!(why.contains("no DT_NULL"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        counting.read.get() <= MAX_DYNAMIC_ENTRIES * 16 + 4096,
        "read {}",
        counting.read.get()
    );
}

#[test]
fn the_read_budget_bounds_what_one_file_costs() {
    // 400 needed names of 4000 bytes each: reading them all would take 1.6 MB.
    let long: Vec<String> = (0..400)
        .map(|i| format!("lib{i:04}{}", "x".repeat(3992)))
        .collect();
    let names: Vec<&str> = long.iter().map(String::as_str).collect();
    let built = build(Class::Elf64, Endian::Little, None, &names, None);
    let counting = Counting {
        inner: built.bytes.as_slice(),
        read: std::cell::Cell::new(0),
    };
    match parse(&counting) {
        Err(ElfError::Malformed(why)) => assert!(why.contains("would take more than"), "{why}"),
        other => panic!("{:?}", other.map(|e| e.needed.len())),
    }
    assert!(
        counting.read.get() <= MAX_BYTES_READ,
        "read {}",
        counting.read.get()
    );
    // The same names, fewer of them, parse.
    let built = build(Class::Elf64, Endian::Little, None, &names[..100], None);
    assert_eq!(parse(built.bytes.as_slice()).unwrap().needed.len(), 100);
}

/// A [`ReadAt`] that counts what is read from it.
struct Counting<'a> {
    inner: &'a [u8],
    read: std::cell::Cell<u64>,
}

impl ReadAt for Counting<'_> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read.set(self.read.get() + buf.len() as u64);
        self.inner.read_exact_at(buf, offset)
    }
}

#[test]
fn the_hosts_own_binaries_parse() {
    // /bin/ls exists on every machine these tests run on (Debian CI, the dev container).
    let ls = std::fs::File::open("/bin/ls").unwrap();
    let elf = parse(&ls).unwrap();
    assert!(
        elf.interpreter
            .as_deref()
            .is_some_and(|i| i.contains("ld-")),
        "{elf:?}"
    );
    assert!(elf.needed.iter().any(|n| n == "libc.so.6"), "{elf:?}");
}

#[test]
fn rpath_is_the_search_path_only_without_runpath() {
    let mut built = typical(Class::Elf64, Endian::Little);
    // The fifth entry is DT_RUNPATH: make it DT_RPATH.
    set64(&mut built.bytes, built.dynamic + 4 * 16, DT_RPATH);
    let elf = parse(built.bytes.as_slice()).unwrap();
    assert_eq!(elf.rpath, ["$ORIGIN", "/opt/x/lib"]);
    assert!(elf.runpath.is_empty());
    assert_eq!(elf.search_path(), ["$ORIGIN", "/opt/x/lib"]);
    let both = Elf {
        runpath: vec!["/run".into()],
        ..elf
    };
    assert_eq!(both.search_path(), ["/run"]);
}

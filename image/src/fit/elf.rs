//! A small, bounded reader of what the dynamic loader needs from an ELF file: its class,
//! byte order and machine, its interpreter (`PT_INTERP`) and, from its dynamic section
//! (`PT_DYNAMIC`), the libraries it needs (`DT_NEEDED`) and where it asks for them to be
//! searched (`DT_RPATH`, `DT_RUNPATH`). ELF32 and ELF64, little- and big-endian.
//!
//! It reads only the pieces it needs (the header, the program headers, the dynamic section and
//! the strings it names) through [`ReadAt`], never more than [`MAX_BYTES_READ`] bytes of one
//! file: a runner's `node` is ~100 MiB and its dynamic strings sit near the start. Every offset
//! and size comes from the file, so every one is checked against the file's size and the
//! budget with checked arithmetic: a malformed or lying file is an [`ElfError::Malformed`],
//! never a panic and never a read past the end.

use std::io;

/// The most bytes read from one file, all reads together. A dynamic section and the few
/// strings it names take a few KiB in every real file; the bound is what a lying file can
/// cost.
pub(crate) const MAX_BYTES_READ: u64 = 1024 * 1024;

/// The most program headers read: real files have ~15; `PN_XNUM` (0xffff, the count moved to
/// section 0) is refused as unreadable.
pub(crate) const MAX_PROGRAM_HEADERS: u16 = 512;

/// The most dynamic-section entries read before a `DT_NULL` must have ended it (real files
/// have a few dozen).
pub(crate) const MAX_DYNAMIC_ENTRIES: u64 = 8192;

/// The longest string (a library name, a search path, the interpreter) read from a file.
pub(crate) const MAX_STRING_LEN: usize = 4096;

/// The most `DT_NEEDED` entries kept from one file (real files need a dozen or two).
pub(crate) const MAX_NEEDED: usize = 1024;

/// How much of a string is read at a time while looking for its NUL: most names are short,
/// so reading [`MAX_STRING_LEN`] for each would spend the budget on nothing.
const STRING_CHUNK: usize = 256;

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;
/// `PN_XNUM`: the real program-header count is in section header 0 (files with >65534).
const PN_XNUM: u16 = 0xffff;

/// ELF `e_type` values the loader runs or loads.
pub(crate) const ET_EXEC: u16 = 2;
pub(crate) const ET_DYN: u16 = 3;

/// Random access to a file's bytes: a file, or a byte buffer in tests.
pub(crate) trait ReadAt {
    /// The size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; the caller has checked `offset + buf.len() <= size()`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let piece = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(piece);
        Ok(())
    }
}

impl ReadAt for std::fs::File {
    fn size(&self) -> u64 {
        // An unreadable size reads as empty: the parse then says "not an ELF".
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// Why a file is not one we can read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ElfError {
    /// Not an ELF file at all (no magic): a script, a `.dll`, a data file. Skipped silently.
    #[error("not an ELF file")]
    NotElf,
    /// Starts like an ELF file but is not one we can read: the reason.
    #[error("not an ELF we can read: {0}")]
    Malformed(String),
    /// Reading failed.
    #[error("cannot read it: {0}")]
    Io(String),
}

fn malformed(why: impl Into<String>) -> ElfError {
    ElfError::Malformed(why.into())
}

/// 32- or 64-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    Elf32,
    Elf64,
}

/// The byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Endian {
    Little,
    Big,
}

/// What a library must match to be loaded with a file: the loader skips a candidate of
/// another class, byte order or machine and keeps searching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Arch {
    pub(crate) class: Class,
    pub(crate) endian: Endian,
    /// `e_machine` (62 x86-64, 183 AArch64, 3 i386, 40 ARM, ...).
    pub(crate) machine: u16,
}

/// What the loader needs from one ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elf {
    pub(crate) arch: Arch,
    /// `e_type`: [`ET_EXEC`], [`ET_DYN`], or another the loader does not run.
    pub(crate) kind: u16,
    /// `PT_INTERP`: the dynamic loader's path.
    pub(crate) interpreter: Option<String>,
    /// `DT_NEEDED`, in order.
    pub(crate) needed: Vec<String>,
    /// `DT_RPATH` split at `:` (the loader ignores it when `DT_RUNPATH` is present).
    pub(crate) rpath: Vec<String>,
    /// `DT_RUNPATH` split at `:`.
    pub(crate) runpath: Vec<String>,
}

impl Elf {
    /// The directories this file asks its own libraries to be searched in first: its
    /// `DT_RUNPATH`, or its `DT_RPATH` when it has none (as glibc does; an executable's
    /// RPATH also applies to its libraries' lookups, which this check does not model).
    pub(crate) fn search_path(&self) -> &[String] {
        if self.runpath.is_empty() {
            &self.rpath
        } else {
            &self.runpath
        }
    }
}

/// Reads through a [`ReadAt`], refusing any read past the end or past [`MAX_BYTES_READ`].
struct Reader<'a, R: ReadAt + ?Sized> {
    src: &'a R,
    size: u64,
    spent: u64,
    endian: Endian,
}

impl<R: ReadAt + ?Sized> Reader<'_, R> {
    fn bytes(&mut self, offset: u64, len: usize, what: &str) -> Result<Vec<u8>, ElfError> {
        let len64 = len as u64;
        let end = offset
            .checked_add(len64)
            .ok_or_else(|| malformed(format!("{what} at an offset that overflows")))?;
        if end > self.size {
            return Err(malformed(format!(
                "{what} ({len} bytes at offset {offset}) lies past the end of the file ({} bytes)",
                self.size
            )));
        }
        self.spent = self.spent.saturating_add(len64);
        if self.spent > MAX_BYTES_READ {
            return Err(malformed(format!(
                "reading it would take more than {MAX_BYTES_READ} bytes"
            )));
        }
        let mut buf = vec![0; len];
        self.src
            .read_exact_at(&mut buf, offset)
            .map_err(|e| ElfError::Io(e.to_string()))?;
        Ok(buf)
    }

    fn u16_at(&self, b: &[u8], at: usize) -> u16 {
        let mut a = [0; 2];
        a.copy_from_slice(&b[at..at + 2]);
        match self.endian {
            Endian::Little => u16::from_le_bytes(a),
            Endian::Big => u16::from_be_bytes(a),
        }
    }

    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let mut a = [0; 4];
        a.copy_from_slice(&b[at..at + 4]);
        match self.endian {
            Endian::Little => u32::from_le_bytes(a),
            Endian::Big => u32::from_be_bytes(a),
        }
    }

    fn u64_at(&self, b: &[u8], at: usize) -> u64 {
        let mut a = [0; 8];
        a.copy_from_slice(&b[at..at + 8]);
        match self.endian {
            Endian::Little => u64::from_le_bytes(a),
            Endian::Big => u64::from_be_bytes(a),
        }
    }

    /// A word of the class: 4 bytes in ELF32, 8 in ELF64.
    fn word_at(&self, class: Class, b: &[u8], at: usize) -> u64 {
        match class {
            Class::Elf32 => u64::from(self.u32_at(b, at)),
            Class::Elf64 => self.u64_at(b, at),
        }
    }

    /// The NUL-terminated string at `offset`, read no further than `limit` (the end of its
    /// table) nor [`MAX_STRING_LEN`].
    fn string(&mut self, offset: u64, limit: u64, what: &str) -> Result<String, ElfError> {
        if offset >= self.size {
            return Err(malformed(format!(
                "{what} at offset {offset} lies past the end of the file ({} bytes)",
                self.size
            )));
        }
        let room = limit.min(self.size).saturating_sub(offset);
        let max = usize::try_from(room)
            .unwrap_or(usize::MAX)
            .min(MAX_STRING_LEN);
        let mut out = Vec::new();
        while out.len() < max {
            let take = STRING_CHUNK.min(max - out.len());
            let chunk = self.bytes(offset + out.len() as u64, take, what)?;
            if let Some(nul) = chunk.iter().position(|&c| c == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return String::from_utf8(out)
                    .map_err(|_| malformed(format!("{what} is not UTF-8")));
            }
            out.extend_from_slice(&chunk);
        }
        Err(malformed(format!(
            "{what} at offset {offset} has no NUL within {max} bytes"
        )))
    }
}

/// One program header, the fields this reader uses.
#[derive(Debug, Clone, Copy)]
struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// Parses what the loader needs from `src`.
pub(crate) fn parse<R: ReadAt + ?Sized>(src: &R) -> Result<Elf, ElfError> {
    let size = src.size();
    let mut r = Reader {
        src,
        size,
        spent: 0,
        endian: Endian::Little,
    };
    if size < 4 {
        return Err(ElfError::NotElf);
    }
    let magic = r.bytes(0, 4, "the magic")?;
    if magic != ELF_MAGIC {
        return Err(ElfError::NotElf);
    }
    let ident = r.bytes(0, 16, "the identification")?;
    let class = match ident[4] {
        1 => Class::Elf32,
        2 => Class::Elf64,
        c => return Err(malformed(format!("unknown class {c}"))),
    };
    r.endian = match ident[5] {
        1 => Endian::Little,
        2 => Endian::Big,
        d => return Err(malformed(format!("unknown byte order {d}"))),
    };
    if ident[6] != 1 {
        return Err(malformed(format!("unknown ELF version {}", ident[6])));
    }
    let (header_len, phoff_at, phentsize_at, phnum_at, ph_len) = match class {
        Class::Elf32 => (52, 28, 42, 44, 32),
        Class::Elf64 => (64, 32, 54, 56, 56),
    };
    let header = r.bytes(0, header_len, "the ELF header")?;
    let kind = r.u16_at(&header, 16);
    let machine = r.u16_at(&header, 18);
    let phoff = r.word_at(class, &header, phoff_at);
    let phentsize = r.u16_at(&header, phentsize_at);
    let phnum = r.u16_at(&header, phnum_at);
    let arch = Arch {
        class,
        endian: r.endian,
        machine,
    };
    if phnum == PN_XNUM || phnum > MAX_PROGRAM_HEADERS {
        return Err(malformed(format!(
            "{phnum} program headers (at most {MAX_PROGRAM_HEADERS} are read)"
        )));
    }
    if phnum > 0 && usize::from(phentsize) < ph_len {
        return Err(malformed(format!(
            "program headers of {phentsize} bytes, less than the {ph_len} of this class"
        )));
    }
    let table_len = usize::from(phentsize) * usize::from(phnum);
    let table = r.bytes(phoff, table_len, "the program headers")?;
    let segments: Vec<Segment> = table
        .chunks_exact(usize::from(phentsize).max(1))
        .take(usize::from(phnum))
        .map(|h| match class {
            Class::Elf32 => Segment {
                kind: r.u32_at(h, 0),
                offset: u64::from(r.u32_at(h, 4)),
                vaddr: u64::from(r.u32_at(h, 8)),
                filesz: u64::from(r.u32_at(h, 16)),
            },
            Class::Elf64 => Segment {
                kind: r.u32_at(h, 0),
                offset: r.u64_at(h, 8),
                vaddr: r.u64_at(h, 16),
                filesz: r.u64_at(h, 32),
            },
        })
        .collect();

    let mut elf = Elf {
        arch,
        kind,
        interpreter: None,
        needed: Vec::new(),
        rpath: Vec::new(),
        runpath: Vec::new(),
    };
    // The loader uses the first PT_INTERP and the first PT_DYNAMIC; so does this.
    if let Some(interp) = segments.iter().find(|s| s.kind == PT_INTERP) {
        let end = interp
            .offset
            .checked_add(interp.filesz)
            .ok_or_else(|| malformed("the interpreter's segment overflows"))?;
        elf.interpreter = Some(r.string(interp.offset, end, "the interpreter")?);
    }
    if let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) {
        read_dynamic(&mut r, &segments, *dynamic, &mut elf)?;
    }
    Ok(elf)
}

/// Reads the dynamic section: its entries first (the string table's address may come after
/// the names that index it), then the strings.
fn read_dynamic<R: ReadAt + ?Sized>(
    r: &mut Reader<'_, R>,
    segments: &[Segment],
    dynamic: Segment,
    elf: &mut Elf,
) -> Result<(), ElfError> {
    let class = elf.arch.class;
    let entry_len: u64 = match class {
        Class::Elf32 => 8,
        Class::Elf64 => 16,
    };
    let count = (dynamic.filesz / entry_len).min(MAX_DYNAMIC_ENTRIES);
    let len = usize::try_from(count * entry_len)
        .map_err(|_| malformed("the dynamic section is too large"))?;
    let table = r.bytes(dynamic.offset, len, "the dynamic section")?;
    let half = usize::try_from(entry_len / 2).unwrap_or(8);
    let mut strtab = None;
    let mut strsz = None;
    let mut needed = Vec::new();
    let mut rpath = Vec::new();
    let mut runpath = Vec::new();
    let mut ended = false;
    for entry in table.chunks_exact(half * 2) {
        let tag = r.word_at(class, entry, 0);
        let value = r.word_at(class, entry, half);
        match tag {
            DT_NULL => {
                ended = true;
                break;
            }
            DT_NEEDED => {
                if needed.len() >= MAX_NEEDED {
                    return Err(malformed(format!(
                        "more than {MAX_NEEDED} needed libraries"
                    )));
                }
                needed.push(value);
            }
            DT_STRTAB => strtab = Some(value),
            DT_STRSZ => strsz = Some(value),
            DT_RPATH => rpath.push(value),
            DT_RUNPATH => runpath.push(value),
            _ => {}
        }
    }
    if !ended {
        return Err(malformed(format!(
            "the dynamic section has no DT_NULL within {count} entries"
        )));
    }
    if needed.is_empty() && rpath.is_empty() && runpath.is_empty() {
        return Ok(());
    }
    let strtab = strtab.ok_or_else(|| malformed("names libraries but has no DT_STRTAB"))?;
    let table_at = file_offset(segments, strtab).ok_or_else(|| {
        malformed(format!(
            "its string table's address {strtab:#x} lies in no loaded segment"
        ))
    })?;
    let table_end = match strsz {
        Some(sz) => table_at
            .checked_add(sz)
            .ok_or_else(|| malformed("the string table's size overflows"))?,
        None => r.size,
    };
    let string = |r: &mut Reader<'_, R>, index: u64, what: &str| {
        let at = table_at
            .checked_add(index)
            .filter(|&at| at < table_end)
            .ok_or_else(|| {
                malformed(format!(
                    "{what}'s name at index {index} lies outside the string table"
                ))
            })?;
        r.string(at, table_end, what)
    };
    for index in needed {
        elf.needed.push(string(r, index, "a needed library")?);
    }
    for index in rpath {
        let path = string(r, index, "DT_RPATH")?;
        elf.rpath.extend(split_search_path(&path));
    }
    for index in runpath {
        let path = string(r, index, "DT_RUNPATH")?;
        elf.runpath.extend(split_search_path(&path));
    }
    Ok(())
}

/// The file offset of virtual address `addr`: through the `PT_LOAD` segment holding it in its
/// file-backed part.
fn file_offset(segments: &[Segment], addr: u64) -> Option<u64> {
    segments
        .iter()
        .filter(|s| s.kind == PT_LOAD)
        .find(|s| addr >= s.vaddr && addr - s.vaddr < s.filesz)
        .and_then(|s| s.offset.checked_add(addr - s.vaddr))
}

/// A search path's directories: `:`-separated, empty entries dropped (the loader would read
/// them as the current directory, which is no directory of the image).
fn split_search_path(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split(':').filter(|d| !d.is_empty()).map(str::to_owned)
}

#[cfg(test)]
pub(crate) mod tests;

//! The daemon's own code, mapped before it serves.
//!
//! A mount daemon runs most of its code for the first time when the first
//! file is read: the pack fetch, the member decoder, the cache's writes,
//! the FUSE read reply. Pages of the executable it has not run yet are in
//! the page cache at best, and after memory pressure (or `drop_caches`)
//! not even there: the first read then waits for the disk a page fault at
//! a time. Measured on a 3,300-file tree at RTT 50 ms with the page cache
//! dropped after the mount: the first file 82 ms, 68 ms with the code
//! mapped; the walk of 1,000 files 0.19 s, 0.15 s.
//!
//! [`map_executable`] asks the kernel to map every page of the
//! executable's segments (`MADV_POPULATE_READ`, Linux 5.14; else one read
//! per page). That is one mostly sequential read, done while the mount
//! opens its snapshot. The pages are the binary file's own, shared and
//! clean: mapped pages survive `drop_caches`, and the kernel may still
//! take them back under memory pressure (nothing is locked). The cost is
//! resident memory the size of the segments (~25 MB), counted in the
//! daemon's RSS.

use std::path::Path;

const PAGE: usize = 4096;

/// One mapping of the executable: its address range and whether it is
/// readable.
#[derive(Debug, PartialEq)]
struct Mapping {
    start: usize,
    end: usize,
    readable: bool,
}

/// The mappings of `exe` in a `/proc/PID/maps` text. A mapping's path is
/// the rest of its line after five fields; a binary replaced on disk since
/// it started is listed with " (deleted)" after its path.
fn mappings_of(maps: &str, exe: &Path) -> Vec<Mapping> {
    let exe = exe.as_os_str().to_string_lossy();
    maps.lines()
        .filter_map(|line| {
            let mut rest = line;
            let mut fields = [""; 5];
            for f in fields.iter_mut() {
                rest = rest.trim_start();
                let cut = rest.find(char::is_whitespace).unwrap_or(rest.len());
                *f = &rest[..cut];
                rest = &rest[cut..];
            }
            let path = rest.trim();
            if path != exe && path.strip_suffix(" (deleted)") != Some(&exe) {
                return None;
            }
            let (a, b) = fields[0].split_once('-')?;
            let start = usize::from_str_radix(a, 16).ok()?;
            let end = usize::from_str_radix(b, 16).ok()?;
            (start < end).then(|| Mapping { start, end, readable: fields[1].starts_with('r') })
        })
        .collect()
}

/// Maps every page of this process's executable (see the module's
/// comment). Returns the bytes it covered.
pub fn map_executable() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut covered = 0;
    for m in mappings_of(&maps, &exe).into_iter().filter(|m| m.readable) {
        let len = m.end - m.start;
        // SAFETY: the range is one of this process's own mappings, listed
        // by the kernel just now; MADV_POPULATE_READ only faults its pages
        // in and changes no byte of it.
        let r = unsafe { libc::madvise(m.start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if r != 0 {
            // An older kernel: a read of each page maps it too.
            for at in (m.start..m.end).step_by(PAGE) {
                // SAFETY: `at` is inside a readable mapping of the
                // executable, which stays mapped while the process runs.
                unsafe { std::ptr::read_volatile(at as *const u8) };
            }
        }
        covered += len;
    }
    Ok(covered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_executables_mappings_by_path_and_no_others() {
        let maps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fd:01 1234    /usr/bin/mado
55d0a0100000-55d0a0900000 r-xp 00100000 fd:01 1234    /usr/bin/mado
55d0a0900000-55d0a0a00000 rw-p 00900000 fd:01 1234    /usr/bin/mado (deleted)
55d0a0a00000-55d0a0b00000 ---p 00a00000 fd:01 1234    /usr/bin/mado
55d0a0b00000-55d0a0c00000 r--p 00000000 fd:01 99      /usr/bin/mado2
55d0a0c00000-55d0a0c00000 r--p 00000000 fd:01 1234    /usr/bin/mado
7f0000000000-7f0000001000 r-xp 00000000 fd:01 77      /usr/lib/libc.so.6
7f0000001000-7f0000002000 rw-p 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0       [stack]
";
        // (The empty range last is dropped: nothing to map.)
        let got = mappings_of(maps, Path::new("/usr/bin/mado"));
        let want = [
            (0x55d0a0000000, 0x55d0a0100000, true),
            (0x55d0a0100000, 0x55d0a0900000, true),
            (0x55d0a0900000, 0x55d0a0a00000, true),
            (0x55d0a0a00000, 0x55d0a0b00000, false),
        ];
        assert_eq!(got, want.map(|(start, end, readable)| Mapping { start, end, readable }));
        // A path with a space in it is the whole rest of the line.
        let spaced = "1000-3000 r-xp 00000000 fd:01 5 /opt/my tools/mado\n";
        assert_eq!(mappings_of(spaced, Path::new("/opt/my tools/mado")).len(), 1);
        assert!(mappings_of(spaced, Path::new("/opt/my")).is_empty());
    }

    /// Resident bytes and sizes (kB) of the executable's readable mappings,
    /// from /proc/self/smaps.
    fn exe_rss_kb() -> (u64, u64) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let (mut rss, mut size, mut ours) = (0, 0, false);
        for line in smaps.lines() {
            let mut it = line.split_whitespace();
            let first = it.next().unwrap_or("");
            if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                let path = line.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
                let readable = it.next().is_some_and(|p| p.starts_with('r'));
                ours = readable && Path::new(path.trim_end_matches(" (deleted)")) == exe;
            } else if ours && first == "Size:" {
                size += it.next().unwrap().parse::<u64>().unwrap();
            } else if ours && first == "Rss:" {
                rss += it.next().unwrap().parse::<u64>().unwrap();
            }
        }
        (rss, size)
    }

    #[test]
    fn every_page_of_the_executable_is_resident_after() {
        // A test binary runs a small part of its code: much of it is not
        // mapped yet.
        let (rss, size) = exe_rss_kb();
        assert!(size > 0, "no mapping of the test binary found");
        assert!(rss < size, "the test binary is already wholly resident ({rss} of {size} kB)");
        let covered = map_executable().unwrap();
        let (rss, size) = exe_rss_kb();
        assert_eq!(covered as u64, size * 1024, "the readable mappings, whole");
        assert_eq!(rss, size, "every page of the executable's readable mappings is resident");
    }
}

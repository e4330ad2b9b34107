//! The partial file of one download and the ledger beside it: magic, segment size, then one
//! little-endian u64 per segment with its bytes done. Bytes are written before the ledger says
//! they are, so a restart (even after SIGKILL) resumes each segment where it stopped.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

const LEDGER_MAGIC: &[u8; 8] = b"MSLEDGR1";
/// Bytes before the first segment's entry: the magic and the segment size.
const HEAD: u64 = 16;
/// A segment's progress reaches the ledger at least every this many bytes.
pub(super) const LEDGER_EVERY: u64 = 1 << 20;
/// Most segments of one file: a larger file gets larger segments, so the ledger and the
/// per-segment counters stay small (512 KiB) whatever size a request names.
pub(super) const MAX_SEGMENTS: u64 = 1 << 16;

/// The ledger beside a partial file.
pub(super) fn ledger_path(partial: &Path) -> PathBuf {
    partial.with_extension("segments")
}

/// The segment size for a file of `size` bytes: `wanted`, or larger when the file would have
/// more than [`MAX_SEGMENTS`].
pub(super) fn segment_size(size: u64, wanted: u64) -> u64 {
    wanted.max(size.div_ceil(MAX_SEGMENTS)).max(1)
}

/// One download in progress: the partial file, its ledger, each segment's bytes done, and what
/// its connections and its hash share.
pub(super) struct Partial {
    /// The directory of the partial file.
    pub dir: PathBuf,
    pub file: File,
    ledger: File,
    segment: u64,
    size: u64,
    done: Vec<AtomicU64>,
    /// Bytes of each segment as last written to the ledger.
    recorded: Vec<AtomicU64>,
    next: AtomicUsize,
    /// Set when the download ends (done, or failed): connections and the hash stop.
    pub stop: AtomicBool,
    /// Woken when bytes land, so the hash does not poll.
    pub wake: Notify,
    /// Time the sha256 spent waiting for bytes to hash.
    pub starved_nanos: AtomicU64,
}

impl Partial {
    /// The partial file and ledger an earlier run left, when they match this file and segment
    /// size; None when there are none or they do not match.
    pub fn resume(partial: &Path, ledger: &Path, size: u64, segment: u64) -> Option<Partial> {
        let count = segments(size, segment)?;
        let expected_len = HEAD.checked_add(count.checked_mul(8)?)?;
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .ok()
        };
        let (l, f) = (open(ledger)?, open(partial)?);
        if l.metadata().ok()?.len() != expected_len || f.metadata().ok()?.len() != size {
            return None;
        }
        let mut buf = vec![0u8; usize::try_from(expected_len).ok()?];
        l.read_exact_at(&mut buf, 0).ok()?;
        let (head, entries) = buf.split_at_checked(HEAD as usize)?;
        if head.get(..8)? != LEDGER_MAGIC || head.get(8..)? != segment.to_le_bytes() {
            return None;
        }
        let done = entries
            .chunks_exact(8)
            .enumerate()
            .map(|(i, b)| {
                let d = u64::from_le_bytes(b.try_into().unwrap_or_default());
                d.min(seg_len(i, segment, size))
            })
            .collect();
        Some(Partial::new(partial, f, l, segment, size, done))
    }

    /// A new, empty partial file of `size` bytes and its ledger, replacing any there.
    pub fn create(
        partial: &Path,
        ledger: &Path,
        size: u64,
        segment: u64,
    ) -> std::io::Result<Partial> {
        let too_many = || std::io::Error::other(format!("{size} bytes in segments of {segment}"));
        let count = segments(size, segment).ok_or_else(too_many)?;
        let expected_len = usize::try_from(HEAD + 8 * count).map_err(|_| too_many())?;
        let f = File::create(partial)?;
        f.set_len(size)?;
        let l = File::create(ledger)?;
        let mut head = LEDGER_MAGIC.to_vec();
        head.extend_from_slice(&segment.to_le_bytes());
        head.resize(expected_len, 0);
        l.write_all_at(&head, 0)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(partial)?;
        let done = vec![0; count as usize];
        Ok(Partial::new(partial, f, l, segment, size, done))
    }

    fn new(
        partial: &Path,
        file: File,
        ledger: File,
        segment: u64,
        size: u64,
        done: Vec<u64>,
    ) -> Partial {
        Partial {
            dir: partial.parent().unwrap_or(Path::new(".")).to_path_buf(),
            file,
            ledger,
            segment,
            size,
            recorded: done.iter().map(|d| AtomicU64::new(*d)).collect(),
            done: done.into_iter().map(AtomicU64::new).collect(),
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            starved_nanos: AtomicU64::new(0),
        }
    }

    /// The bytes of segment `i` (empty past the last segment).
    pub fn range(&self, i: usize) -> std::ops::Range<u64> {
        let start = (i as u64).saturating_mul(self.segment).min(self.size);
        start..start + seg_len(i, self.segment, self.size)
    }

    /// Bytes of segment `i` in place.
    pub fn done(&self, i: usize) -> u64 {
        self.done.get(i).map_or(0, |d| d.load(Ordering::Acquire))
    }

    /// Records that segment `i` has `bytes` in place (written to the file already); the ledger
    /// hears of it every [`LEDGER_EVERY`] bytes.
    pub fn advance(&self, i: usize, bytes: u64) {
        let (Some(d), Some(r)) = (self.done.get(i), self.recorded.get(i)) else {
            return;
        };
        d.store(bytes, Ordering::Release);
        if bytes.saturating_sub(r.load(Ordering::Relaxed)) >= LEDGER_EVERY {
            self.record(i);
        }
    }

    pub fn done_total(&self) -> u64 {
        self.done
            .iter()
            .fold(0u64, |a, d| a.saturating_add(d.load(Ordering::Relaxed)))
    }

    /// The next segment nobody works on that still misses bytes, in file order.
    pub fn claim(&self) -> Option<usize> {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.done.len() {
                return None;
            }
            let r = self.range(i);
            if self.done(i) < r.end - r.start {
                return Some(i);
            }
        }
    }

    /// Whether some segment is still to be claimed by a connection.
    pub fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.done.len()
    }

    /// Bytes from the start of the file that are all in place.
    pub fn contiguous(&self) -> u64 {
        let mut end = 0;
        for (i, d) in self.done.iter().enumerate() {
            let d = d.load(Ordering::Acquire);
            end = self.range(i).start + d;
            if d < seg_len(i, self.segment, self.size) {
                break;
            }
        }
        end
    }

    /// Writes segment `i`'s progress to the ledger (the bytes themselves are written first).
    pub fn record(&self, i: usize) {
        let (Some(d), Some(r)) = (self.done.get(i), self.recorded.get(i)) else {
            return;
        };
        let d = d.load(Ordering::Relaxed);
        let at = HEAD + 8 * i as u64;
        if self.ledger.write_all_at(&d.to_le_bytes(), at).is_ok() {
            r.store(d, Ordering::Relaxed);
        }
    }

    /// Writes every segment's progress the ledger does not have yet.
    pub fn flush(&self) {
        for (i, (d, r)) in self.done.iter().zip(&self.recorded).enumerate() {
            if r.load(Ordering::Relaxed) != d.load(Ordering::Relaxed) {
                self.record(i);
            }
        }
    }
}

/// How many segments a file has; None when more than [`MAX_SEGMENTS`].
fn segments(size: u64, segment: u64) -> Option<u64> {
    Some(size.div_ceil(segment.max(1))).filter(|&n| n <= MAX_SEGMENTS)
}

fn seg_len(i: usize, segment: u64, size: u64) -> u64 {
    let start = (i as u64).saturating_mul(segment);
    segment.min(size.saturating_sub(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_file_gets_larger_segments_so_its_ledger_stays_small() {
        assert_eq!(segment_size(4 << 30, 64 << 20), 64 << 20);
        let huge = 64u64 << 40;
        let s = segment_size(huge, 1 << 20);
        assert!(huge.div_ceil(s) <= MAX_SEGMENTS, "{s}");
        assert_eq!(segment_size(0, 0), 1);
    }

    #[test]
    fn a_ledger_survives_a_restart_and_a_foreign_one_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("x.part");
        let ledger = ledger_path(&part);
        let p = Partial::create(&part, &ledger, 3 << 20, 1 << 20).unwrap();
        p.file.write_all_at(&[7u8; 1000], 1 << 20).unwrap();
        p.advance(1, 1000);
        p.flush();
        drop(p);
        let again = Partial::resume(&part, &ledger, 3 << 20, 1 << 20).unwrap();
        assert_eq!(
            (again.done(0), again.done(1), again.done_total()),
            (0, 1000, 1000)
        );
        assert_eq!(again.contiguous(), 0);
        assert!(Partial::resume(&part, &ledger, 3 << 20, 2 << 20).is_none());
        assert!(Partial::resume(&part, &ledger, 4 << 20, 1 << 20).is_none());
        // A ledger claiming more than a segment holds counts as the segment's length.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&ledger)
            .unwrap()
            .write_all_at(&u64::MAX.to_le_bytes(), HEAD)
            .unwrap();
        let lying = Partial::resume(&part, &ledger, 3 << 20, 1 << 20).unwrap();
        assert_eq!(lying.done(0), 1 << 20);
        assert_eq!(lying.done(99), 0, "no segment 99, nothing done");
    }
}

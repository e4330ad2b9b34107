//! Progress lines of one file's copy, at most one every few seconds.

use std::io::Write;
use std::time::{Duration, Instant};

use super::Wanted;
use crate::units::human_bytes;

/// Progress lines for one file.
pub(super) struct Progress {
    path: String,
    size: u64,
    pub started: Instant,
    last: Instant,
    pub fetched: u64,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(5);

    pub fn new(f: &Wanted) -> Progress {
        let now = Instant::now();
        Progress {
            path: f.path.clone(),
            size: f.size,
            started: now,
            last: now,
            fetched: 0,
        }
    }

    /// `n` more bytes arrived and `have` are in place; prints a line when one is due.
    pub fn tick(&mut self, have: u64, n: u64, out: &mut impl Write) {
        self.fetched = self.fetched.saturating_add(n);
        if self.last.elapsed() < Self::EVERY || have >= self.size {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let _ = writeln!(
            out,
            "{}: {}% ({} of {}, {}/s)",
            self.path,
            percent(have, self.size),
            human_bytes(have),
            human_bytes(self.size),
            human_bytes((self.fetched as f64 / secs) as u64)
        );
    }
}

/// `have` as a whole percentage of `size` (0 to 100, whatever the sizes).
fn percent(have: u64, size: u64) -> u64 {
    (u128::from(have.min(size)) * 100 / u128::from(size.max(1))) as u64
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn percentages_of_huge_files_do_not_overflow() {
        assert_eq!(percent(u64::MAX / 2, u64::MAX), 49);
        assert_eq!(percent(5, 0), 0);
        assert_eq!(percent(1, 4), 25);
    }
}

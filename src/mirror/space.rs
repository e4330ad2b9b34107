//! The mirror's disk: room for a set is checked before a byte of it is fetched, and blobs that no
//! ModelServe references are deleted: after a grace period, or earlier, oldest first, when the
//! volume passes its high watermark (down to the low one) or a new set needs their room.
//!
//! The mirror never guesses what is referenced. The operator tells it the live set (every sha256
//! in a resolved set of every ModelServe it watches); until it has, nothing is deleted. A blob
//! asked for by a request, or downloading, counts as referenced too, for a while after.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::units::{human_bytes, human_duration, parse_duration};

/// The disk flags of `modelserve mirror`.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct SpaceArgs {
    /// A blob no ModelServe references is deleted this long after the operator last listed it
    /// as referenced (0s: as soon as the operator says so).
    #[arg(long = "gc-grace", env = "MODELSERVE_MIRROR_GC_GRACE", default_value = "24h", value_parser = parse_duration)]
    pub grace: Duration,
    /// Percent of the volume in use above which unreferenced blobs go early, oldest first...
    #[arg(long, env = "MODELSERVE_MIRROR_HIGH_WATERMARK", default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub high_watermark: u8,
    /// ...until the use is down to this percent.
    #[arg(long, env = "MODELSERVE_MIRROR_LOW_WATERMARK", default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub low_watermark: u8,
    /// The most bytes the store may hold, when it shares its volume or the volume is larger
    /// than it may use, e.g. 500Gi (default: the whole volume).
    #[arg(long, env = "MODELSERVE_MIRROR_CAPACITY", value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// A blob a fetch request named counts as referenced this long after, covering the time
    /// until the operator's next live set lists it (whatever the grace: with --gc-grace 0s a
    /// blob just downloaded would otherwise go before the operator first lists it).
    #[arg(long, env = "MODELSERVE_MIRROR_REQUEST_PIN", default_value = "2m", value_parser = parse_duration)]
    pub request_pin: Duration,
}

fn parse_capacity(s: &str) -> Result<u64, String> {
    match crate::units::parse_quantity(s) {
        Some(b) if b > 0 => Ok(b),
        _ => Err(format!("{s} is not a size such as 500Gi or 2Ti")),
    }
}

impl Default for SpaceArgs {
    fn default() -> Self {
        SpaceArgs {
            grace: Duration::from_secs(24 * 3600),
            high_watermark: 90,
            low_watermark: 80,
            capacity: None,
            request_pin: Duration::from_secs(120),
        }
    }
}

impl SpaceArgs {
    /// Checks the flags together; the error names the flag and what would be valid.
    pub fn validate(&self) -> Result<(), String> {
        if self.low_watermark >= self.high_watermark {
            return Err(format!(
                "--low-watermark: {} must be below --high-watermark ({})",
                self.low_watermark, self.high_watermark
            ));
        }
        Ok(())
    }

    /// How often the collector looks (and also right after each live set): a tenth of the
    /// grace, between 1s and 10s.
    pub fn interval(&self) -> Duration {
        (self.grace / 10).clamp(Duration::from_secs(1), Duration::from_secs(10))
    }

    /// How long a requested blob stays referenced without the operator's word.
    pub fn pin(&self) -> Duration {
        self.request_pin
    }
}

/// The volume as the store sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Bytes in use, counted against `total`.
    pub used: u64,
    pub total: u64,
    /// Bytes a new download may still write.
    pub available: u64,
}

impl Volume {
    /// From the filesystem's figures and the store's own bytes: with a capacity the store counts
    /// its own bytes against it (and never more than the filesystem has free); without, the
    /// whole filesystem is the mirror's.
    pub fn of(fs_total: u64, fs_free: u64, store_bytes: u64, capacity: Option<u64>) -> Volume {
        match capacity {
            Some(cap) => Volume {
                used: store_bytes,
                total: cap,
                available: cap.saturating_sub(store_bytes).min(fs_free),
            },
            None => Volume {
                used: fs_total.saturating_sub(fs_free),
                total: fs_total,
                available: fs_free,
            },
        }
    }

    fn percent_over(&self, used: u64, percent: u8) -> bool {
        u128::from(used) * 100 > u128::from(self.total) * u128::from(percent)
    }
}

/// Why a blob was deleted (the `reason` label of the evictions metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Reason {
    /// Unreferenced for the whole grace period.
    Grace,
    /// Unreferenced, deleted early because the volume passed its high watermark.
    Watermark,
    /// Unreferenced, deleted early to make room for a set that was asked for.
    Capacity,
}

/// One verified blob in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub sha256: String,
    pub size: u64,
    /// When it was written: of blobs unreferenced equally long, the older goes first.
    pub modified: std::time::SystemTime,
}

/// A live set older than this is not gone by: nothing is deleted until the operator speaks
/// again.
pub const LIVE_SET_STALE: Duration = Duration::from_secs(600);

/// What the collector knows about references.
#[derive(Debug, Default)]
pub struct Refs {
    /// The operator's last word, and when it came; None until it first speaks.
    live: Option<(HashSet<String>, Instant)>,
    /// Blobs asked for by a request, and when last.
    requested: HashMap<String, Instant>,
    /// Since when each blob has been unreferenced, as the collector saw it.
    since: HashMap<String, Instant>,
    /// Whether the live set's staleness has been reported (once until the next set).
    stale_told: bool,
}

impl Refs {
    /// The operator's live set replaces the last one.
    pub fn tell(&mut self, live: HashSet<String>, now: Instant) {
        self.live = Some((live, now));
        self.stale_told = false;
    }

    pub fn told(&self) -> bool {
        self.live.is_some()
    }

    /// A request names `sha256`: it is referenced for `pin` from now.
    pub fn requested(&mut self, sha256: &str, now: Instant) {
        self.requested.insert(sha256.to_string(), now);
        self.since.remove(sha256);
    }

    /// Whether the operator's last live set is too old to go by (it sends one every 30 seconds:
    /// a set this old means it cannot reach the mirror, and blobs mirrored since are missing
    /// from it).
    pub fn stale(&self, now: Instant) -> bool {
        self.live
            .as_ref()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) > LIVE_SET_STALE)
    }

    /// Whether the live set is stale and that has not been said since the operator last spoke:
    /// true once per staleness.
    pub fn newly_stale(&mut self, now: Instant) -> bool {
        let report = self.stale(now) && !self.stale_told;
        self.stale_told |= report;
        report
    }

    /// Whether `sha` is live, downloading, or asked for within `pin`; everything is while the
    /// operator has not spoken, or its word is stale.
    pub fn referenced(
        &self,
        sha: &str,
        busy: &HashSet<String>,
        now: Instant,
        pin: Duration,
    ) -> bool {
        let Some((live, _)) = &self.live else {
            return true;
        };
        if self.stale(now) {
            return true;
        }
        live.contains(sha)
            || busy.contains(sha)
            || self
                .requested
                .get(sha)
                .is_some_and(|t| now.saturating_duration_since(*t) < pin)
    }

    /// Brings the unreferenced-since times up to date with `blobs` and returns the blobs that
    /// may be deleted, each with the time it has been unreferenced, oldest first.
    pub fn unreferenced(
        &mut self,
        blobs: &[Blob],
        busy: &HashSet<String>,
        now: Instant,
        pin: Duration,
    ) -> Vec<(Blob, Duration)> {
        let present: HashSet<&str> = blobs.iter().map(|b| b.sha256.as_str()).collect();
        self.since.retain(|sha, _| present.contains(sha.as_str()));
        self.requested
            .retain(|_, t| now.saturating_duration_since(*t) < pin);
        let mut out = Vec::new();
        for b in blobs {
            if self.referenced(&b.sha256, busy, now, pin) {
                self.since.remove(&b.sha256);
                continue;
            }
            let since = *self.since.entry(b.sha256.clone()).or_insert(now);
            out.push((b.clone(), now.saturating_duration_since(since)));
        }
        out.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| a.0.modified.cmp(&b.0.modified))
                .then_with(|| a.0.sha256.cmp(&b.0.sha256))
        });
        out
    }
}

/// The collector's decision: which unreferenced blobs go now, and why. Those past the grace go;
/// then, while the volume is over its high watermark, the oldest others go until it is at or
/// under the low one. `candidates` is oldest first, as [`Refs::unreferenced`] returns it.
pub fn plan(
    candidates: &[(Blob, Duration)],
    volume: Volume,
    args: &SpaceArgs,
) -> Vec<(Blob, Reason)> {
    let mut out = Vec::new();
    let mut used = volume.used;
    let mut rest = Vec::new();
    for (b, age) in candidates {
        if *age >= args.grace {
            used = used.saturating_sub(b.size);
            out.push((b.clone(), Reason::Grace));
        } else {
            rest.push(b);
        }
    }
    // Over the high watermark as the pass found it: down to the low one, grace deletions
    // counted.
    if volume.percent_over(volume.used, args.high_watermark) {
        for b in rest {
            if !volume.percent_over(used, args.low_watermark) {
                break;
            }
            used = used.saturating_sub(b.size);
            out.push((b.clone(), Reason::Watermark));
        }
    }
    out
}

/// The oldest unreferenced blobs that together free `needed` bytes, or None when all of them
/// would not.
pub fn make_room(candidates: &[(Blob, Duration)], needed: u64) -> Option<Vec<Blob>> {
    let mut freed = 0u64;
    let mut out = Vec::new();
    for (b, _) in candidates {
        if freed >= needed {
            break;
        }
        freed = freed.saturating_add(b.size);
        out.push(b.clone());
    }
    (freed >= needed).then_some(out)
}

/// Why a set was refused before any of it was fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub needed: u64,
    pub available: u64,
    pub reserved: u64,
    pub reclaimable: u64,
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the set needs {} on the mirror's volume, which has {} free less {} reserved by downloads under way",
            human_bytes(self.needed),
            human_bytes(self.available),
            human_bytes(self.reserved),
        )?;
        if self.reclaimable > 0 {
            write!(
                f,
                " (and {} held by blobs no ModelServe references is not enough)",
                human_bytes(self.reclaimable)
            )?;
        }
        write!(
            f,
            "; give the mirror a larger volume (mirror.storage.size) or delete ModelServes it no longer needs"
        )
    }
}

/// A line for the log about one pass.
pub fn describe(deleted: &[(Blob, Reason)], grace: Duration) -> String {
    let bytes: u64 = deleted.iter().map(|(b, _)| b.size).sum();
    format!(
        "deleted {} unreferenced blob(s), {} (grace {})",
        deleted.len(),
        human_bytes(bytes),
        human_duration(grace)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(n: u8, size: u64) -> Blob {
        Blob {
            sha256: format!("{n:0>64}"),
            size,
            modified: std::time::UNIX_EPOCH + Duration::from_secs(u64::from(n)),
        }
    }

    fn args(grace: u64, high: u8, low: u8) -> SpaceArgs {
        SpaceArgs {
            grace: Duration::from_secs(grace),
            high_watermark: high,
            low_watermark: low,
            capacity: None,
            request_pin: Duration::from_secs(60),
        }
    }

    #[test]
    fn nothing_is_deleted_until_the_operator_has_said_what_is_live() {
        let mut refs = Refs::default();
        let blobs = [blob(1, 10)];
        let now = Instant::now();
        let c = refs.unreferenced(&blobs, &HashSet::new(), now, Duration::ZERO);
        assert!(c.is_empty(), "unknown means referenced");
        refs.tell(HashSet::new(), now);
        let c = refs.unreferenced(&blobs, &HashSet::new(), now, Duration::ZERO);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_live_set_the_operator_stopped_sending_deletes_nothing() {
        let mut refs = Refs::default();
        let blobs = [blob(1, 10)];
        let then = Instant::now();
        refs.tell(HashSet::new(), then);
        let later = then + LIVE_SET_STALE + Duration::from_secs(1);
        assert!(refs.stale(later));
        let c = refs.unreferenced(&blobs, &HashSet::new(), later, Duration::ZERO);
        assert!(c.is_empty(), "a stale live set is no word at all");
        // The warning comes once per staleness, not on every pass.
        assert!(refs.newly_stale(later));
        assert!(!refs.newly_stale(later + Duration::from_secs(10)));
        refs.tell(HashSet::new(), later);
        assert!(!refs.newly_stale(later));
        let again = later + LIVE_SET_STALE + Duration::from_secs(1);
        assert!(refs.newly_stale(again));
        refs.tell(HashSet::new(), later);
        assert_eq!(
            refs.unreferenced(&blobs, &HashSet::new(), later, Duration::ZERO)
                .len(),
            1
        );
    }

    #[test]
    fn the_request_pin_holds_whatever_the_grace() {
        let a = SpaceArgs {
            grace: Duration::ZERO,
            ..SpaceArgs::default()
        };
        assert_eq!(a.pin(), Duration::from_secs(120));
    }

    #[test]
    fn a_live_downloading_or_recently_requested_blob_is_never_a_candidate() {
        let mut refs = Refs::default();
        let now = Instant::now();
        refs.tell(HashSet::from([blob(1, 1).sha256]), now);
        refs.requested(&blob(3, 1).sha256, now);
        let busy = HashSet::from([blob(2, 1).sha256]);
        let blobs = [blob(1, 1), blob(2, 1), blob(3, 1), blob(4, 1)];
        let pin = Duration::from_secs(60);
        let c = refs.unreferenced(&blobs, &busy, now, pin);
        assert_eq!(
            c.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>(),
            [blob(4, 1)]
        );
        // The request's pin runs out; the live and downloading ones stay.
        let later = now + Duration::from_secs(61);
        let c = refs.unreferenced(&blobs, &busy, later, pin);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].0, blob(4, 1), "oldest first");
        assert_eq!(c[0].1, Duration::from_secs(61));
    }

    #[test]
    fn grace_then_watermarks_decide_what_goes() {
        let vol = |used| Volume {
            used,
            total: 100,
            available: 100 - used,
        };
        let old = (blob(1, 10), Duration::from_secs(100));
        let young = (blob(2, 30), Duration::from_secs(5));
        let younger = (blob(3, 20), Duration::from_secs(1));
        let c = [old.clone(), young.clone(), younger.clone()];
        // Under the high watermark only the grace counts.
        let p = plan(&c, vol(60), &args(50, 90, 80));
        assert_eq!(p, [(blob(1, 10), Reason::Grace)]);
        // Over it (95%): the grace one, then the oldest young one, down to 80% or under.
        let p = plan(&c, vol(95), &args(50, 90, 60));
        assert_eq!(
            p,
            [
                (blob(1, 10), Reason::Grace),
                (blob(2, 30), Reason::Watermark)
            ],
            "95 - 10 = 85 > 60, - 30 = 55 <= 60"
        );
        // Referenced bytes may keep it over: every candidate goes, nothing else.
        let p = plan(&[younger], vol(99), &args(50, 90, 10));
        assert_eq!(p, [(blob(3, 20), Reason::Watermark)]);
    }

    #[test]
    fn room_is_made_from_the_oldest_or_not_at_all() {
        let c = [
            (blob(1, 10), Duration::from_secs(9)),
            (blob(2, 10), Duration::from_secs(5)),
        ];
        assert_eq!(make_room(&c, 5), Some(vec![blob(1, 10)]));
        assert_eq!(make_room(&c, 20).map(|v| v.len()), Some(2));
        assert_eq!(make_room(&c, 21), None);
        assert_eq!(make_room(&c, 0), Some(vec![]));
    }

    #[test]
    fn a_capacity_counts_the_stores_own_bytes_and_never_more_than_the_disk_has() {
        assert_eq!(
            Volume::of(1000, 400, 100, Some(300)),
            Volume {
                used: 100,
                total: 300,
                available: 200
            }
        );
        assert_eq!(Volume::of(1000, 50, 100, Some(300)).available, 50);
        assert_eq!(
            Volume::of(1000, 400, 100, None),
            Volume {
                used: 600,
                total: 1000,
                available: 400
            }
        );
    }

    #[test]
    fn a_refusal_names_both_figures_and_what_to_do() {
        let e = NoRoom {
            needed: 3 << 30,
            available: 1 << 30,
            reserved: 512 << 20,
            reclaimable: 0,
        }
        .to_string();
        assert!(
            e.starts_with("the set needs 3.0 GiB on the mirror's volume, which has 1.0 GiB free less 512.0 MiB reserved"),
            "{e}"
        );
        assert!(e.contains("mirror.storage.size"), "{e}");
    }

    #[test]
    fn watermarks_must_be_ordered() {
        assert!(args(1, 90, 80).validate().is_ok());
        let e = args(1, 80, 80).validate().unwrap_err();
        assert!(e.starts_with("--low-watermark: 80 must be below"), "{e}");
    }
}

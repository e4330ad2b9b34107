//! The connection ramp: one connection at first, one more whenever the sha256 spent most of the
//! last tick waiting for bytes, up to the most allowed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;

use super::ledger::Partial;

/// How often the mirror considers opening one more connection.
pub(super) const RAMP_EVERY: Duration = Duration::from_millis(100);

/// Runs the connections of one download: one at first, then one more every `RAMP_EVERY` in
/// which the sha256 spent most of its time waiting for bytes, up to `most`. A link whose one
/// connection already outpaces the hash gains nothing from more: they would only take CPU
/// from it and make it read back bytes that arrived out of order.
pub(super) async fn connect<W, F, T>(job: &Partial, most: usize, open: F) -> Vec<T>
where
    F: Fn() -> W,
    W: Future<Output = T>,
{
    use futures::stream::FuturesUnordered;
    let mut running = FuturesUnordered::new();
    running.push(open());
    let mut opened = 1;
    let mut results = Vec::new();
    let mut tick = tokio::time::interval(RAMP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut starved = job.starved_nanos.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            r = running.next() => match r {
                Some(r) => results.push(r),
                None => return results,
            },
            _ = tick.tick(), if opened < most => {
                let now = job.starved_nanos.load(Ordering::Relaxed);
                let hungry = now.saturating_sub(starved) > RAMP_EVERY.as_nanos() as u64 / 2;
                starved = now;
                if hungry && job.unclaimed() && !job.stop.load(Ordering::Acquire) {
                    running.push(open());
                    opened += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::super::ledger::ledger_path;
    use super::*;

    /// Opens up to `most` connections that each last 0.7 s, while `starve` says whether the
    /// hash waits for bytes; answers how many were opened.
    async fn opened(most: usize, starve: bool) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("blob.incomplete");
        let job = Arc::new(Partial::create(&part, &ledger_path(&part), 8 << 20, 1 << 20).unwrap());
        let count = AtomicUsize::new(0);
        let feeder = {
            let job = job.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if starve {
                        job.starved_nanos.fetch_add(10_000_000, Ordering::Relaxed);
                    }
                }
            })
        };
        let results = connect(&job, most, || {
            count.fetch_add(1, Ordering::Relaxed);
            async {
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
        .await;
        feeder.abort();
        assert_eq!(results.len(), count.load(Ordering::Relaxed));
        count.load(Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn a_link_that_keeps_the_hash_busy_stays_on_one_connection() {
        assert_eq!(opened(4, false).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hash_waiting_for_bytes_opens_connections_up_to_the_most() {
        assert_eq!(opened(4, true).await, 4);
        assert_eq!(opened(2, true).await, 2);
    }
}

//! The sha256 of a download, following the bytes as they become contiguous and reading them
//! back from the page cache; and the hash of what a partial copy already holds.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::ledger::Partial;

/// Bytes hashed per read (one reused buffer per download).
const CHUNK: u64 = 8 << 20;

/// Hashes the file as it becomes contiguous; None when the download stopped before the end.
pub(super) async fn hash(job: Arc<Partial>, size: u64) -> std::io::Result<Option<[u8; 32]>> {
    // The hash and one reused buffer travel to the blocking thread and back.
    let mut state = (Sha256::new(), vec![0u8; CHUNK as usize]);
    let mut hashed = 0u64;
    loop {
        let ready = job.contiguous().min(size);
        if ready > hashed {
            // Just-written bytes come back from the page cache, off the async threads.
            let (j, (mut h, mut buf)) = (job.clone(), state);
            let len = (ready - hashed).min(CHUNK);
            let at = hashed;
            state = tokio::task::spawn_blocking(move || {
                let part = buf.get_mut(..len as usize).unwrap_or_default();
                j.file.read_exact_at(part, at)?;
                h.update(&*part);
                // Hashed bytes are final: start writing them to disk now (the kernel does it in
                // the background), so the fsync before the file is present finds little left.
                let _ = rustix::fs::fadvise(
                    &j.file,
                    at,
                    std::num::NonZeroU64::new(len),
                    rustix::fs::Advice::DontNeed,
                );
                Ok::<_, std::io::Error>((h, buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            hashed += len;
            continue;
        }
        if hashed == size {
            return Ok(Some(state.0.finalize().into()));
        }
        if job.stop.load(Ordering::Acquire) && job.contiguous() == hashed {
            return Ok(None);
        }
        let waited = Instant::now();
        let _ = tokio::time::timeout(Duration::from_millis(20), job.wake.notified()).await;
        let nanos = u64::try_from(waited.elapsed().as_nanos()).unwrap_or(u64::MAX);
        job.starved_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// The hash of what a partial file already holds, and its length (reading it once); a file
/// longer than `size` is removed and counts as nothing.
pub fn resume_from(partial: &Path, size: u64) -> std::io::Result<(Sha256, u64)> {
    use std::io::Read;
    let mut hasher = Sha256::new();
    let mut file = match File::open(partial) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((hasher, 0)),
        Err(e) => return Err(e),
    };
    if file.metadata()?.len() > size {
        drop(file);
        std::fs::remove_file(partial)?;
        return Ok((hasher, 0));
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut have = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        let Some(read) = buf.get(..n).filter(|r| !r.is_empty()) else {
            break;
        };
        hasher.update(read);
        have = have.saturating_add(n as u64);
    }
    Ok((hasher, have))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_copy_longer_than_the_file_is_dropped_and_a_shorter_one_is_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf.part");
        assert_eq!(resume_from(&p, 10).unwrap().1, 0, "none there");
        std::fs::write(&p, b"abc").unwrap();
        let (h, have) = resume_from(&p, 10).unwrap();
        assert_eq!(
            (hex::encode(h.finalize()), have),
            (hex::encode(Sha256::digest(b"abc")), 3)
        );
        assert_eq!(resume_from(&p, 2).unwrap().1, 0);
        assert!(
            !p.exists(),
            "a copy longer than the file cannot be its start"
        );
    }
}

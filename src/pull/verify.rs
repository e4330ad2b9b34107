//! What is already in `--dest`: room for what is still to pull, a file in place that is intact
//! (or removed when it is not), and the durable move of a verified copy into place.

use std::path::{Path, PathBuf};

use sha2::Digest;

use super::{Plan, PullError, Wanted};
use crate::mirror::fetch::resume_from;
use crate::mirror::store::free_space;
use crate::units::human_bytes;

/// Fails before the first byte moves when the files still to pull cannot all fit (a file in
/// place of the right size counts as pulled; its hash is checked later).
pub(super) fn check_room_for_all(plan: &Plan) -> Result<(), PullError> {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut count = 0;
    let mut needed = 0u64;
    for f in &plan.files {
        let target = plan.dest.join(&f.path);
        if len(&target) == f.size && target.is_file() {
            continue;
        }
        count += 1;
        needed = needed.saturating_add(f.size.saturating_sub(len(&part_path(&target))));
    }
    let free = free_space(&plan.dest).map_err(|source| PullError::Disk {
        path: plan
            .files
            .first()
            .map(|f| f.path.clone())
            .unwrap_or_default(),
        dest: plan.dest.display().to_string(),
        source,
    })?;
    if count > 1 && free < needed {
        return Err(PullError::NoSpaceForAll {
            count,
            dest: plan.dest.display().to_string(),
            needed: human_bytes(needed),
            free: human_bytes(free),
        });
    }
    Ok(())
}

/// Whether `target` holds the file already; a wrong copy is removed.
pub(super) async fn already_present(target: &Path, f: &Wanted) -> std::io::Result<bool> {
    match std::fs::metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
        Ok(m) if m.is_file() && m.len() == f.size => {}
        Ok(_) => {
            tracing::warn!(path = %f.path, "a file of another size is in the way; replacing it");
            std::fs::remove_file(target)?;
            return Ok(false);
        }
    }
    let (path, size) = (target.to_path_buf(), f.size);
    let (hasher, _) = tokio::task::spawn_blocking(move || resume_from(&path, size))
        .await
        .map_err(std::io::Error::other)??;
    let got = hex::encode(hasher.finalize());
    if got == f.sha256 {
        return Ok(true);
    }
    tracing::warn!(path = %f.path, %got, want = %f.sha256, "the file in place has another sha256; replacing it");
    std::fs::remove_file(target)?;
    Ok(false)
}

/// Where a copy grows until it is verified: `DIR/PATH.part`.
pub(super) fn part_path(target: &Path) -> PathBuf {
    let mut s = target.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Makes a verified copy durable and moves it into place.
pub(super) fn place(part: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::File::open(part)?.sync_all()?;
    std::fs::rename(part, target)?;
    if let Some(dir) = target.parent() {
        // The rename itself survives a crash only once the directory is synced.
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Whether an I/O error means the filesystem has no room (ENOSPC, EDQUOT, or EFBIG from a file
/// size limit).
pub(super) fn is_out_of_space(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(e),
        Some(Errno::NOSPC | Errno::DQUOT | Errno::FBIG)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_part_file_sits_beside_the_target() {
        assert_eq!(
            part_path(Path::new("/models/Q4/m.gguf")),
            PathBuf::from("/models/Q4/m.gguf.part")
        );
        assert_eq!(
            part_path(Path::new("/models/модель.gguf")),
            PathBuf::from("/models/модель.gguf.part")
        );
    }
}

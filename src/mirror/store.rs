//! The mirror's directory, in the Hugging Face cache layout so llama.cpp and huggingface_hub can
//! read it: `models--owner--name/blobs/<sha256>` and `snapshots/<commit>/<path>` as relative
//! links. Partial downloads live in `.incomplete/` and are never visible under snapshots; every
//! verified blob is also linked into `.by-sha256/` so the same content in another repository or
//! commit is never fetched again.

use std::io;
use std::path::{Path, PathBuf};

use super::request::Invalid;

/// One file of a repository at a commit, as the registry published it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileRef {
    pub repo: String,
    pub commit: String,
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

impl FileRef {
    /// Refuses anything that could escape the store or is not a pinned, hashed file of a
    /// bounded size, naming the field and what would be valid.
    pub fn validate(&self) -> Result<(), Invalid> {
        super::request::check_file(self)
    }
}

/// The mirror's directory.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (and creates) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> io::Result<Store> {
        let root = root.into();
        std::fs::create_dir_all(root.join(".incomplete"))?;
        std::fs::create_dir_all(root.join(".by-sha256"))?;
        Ok(Store { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// Where a download of `sha256` grows until it is verified.
    pub fn partial(&self, sha256: &str) -> PathBuf {
        self.root.join(".incomplete").join(format!("{sha256}.part"))
    }

    fn verified(&self, sha256: &str) -> PathBuf {
        self.root.join(".by-sha256").join(sha256)
    }

    /// The snapshot path a reader opens.
    pub fn snapshot(&self, f: &FileRef) -> PathBuf {
        self.snapshot_of(&f.repo, &f.commit, &f.path)
    }

    /// The snapshot path of `path` in `repo` at `commit` (all three checked by the caller).
    pub fn snapshot_of(&self, repo: &str, commit: &str, path: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("snapshots")
            .join(commit)
            .join(path)
    }

    /// Whether the file is present and verified: its snapshot link resolves to a blob of its size.
    pub fn present(&self, f: &FileRef) -> bool {
        std::fs::metadata(self.snapshot(f)).is_ok_and(|m| m.is_file() && m.len() == f.size)
    }

    /// Makes a file present from an already verified blob of the same content, if there is one.
    pub fn adopt(&self, f: &FileRef) -> io::Result<bool> {
        let verified = self.verified(&f.sha256);
        match std::fs::metadata(&verified) {
            Ok(m) if m.len() == f.size => {
                self.link(f)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Moves a verified partial download into place and links it into the snapshot.
    pub fn commit(&self, f: &FileRef) -> io::Result<()> {
        let partial = self.partial(&f.sha256);
        std::fs::File::open(&partial)?.sync_all()?;
        std::fs::rename(&partial, self.verified(&f.sha256))?;
        self.link(f)
    }

    fn link(&self, f: &FileRef) -> io::Result<()> {
        let blobs = self.repo_dir(&f.repo).join("blobs");
        std::fs::create_dir_all(&blobs)?;
        let blob = blobs.join(&f.sha256);
        if !blob.exists() {
            // A hard link shares the bytes with .by-sha256 (one copy on disk per content).
            match std::fs::hard_link(self.verified(&f.sha256), &blob) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let snapshot = self.snapshot(f);
        let dir = snapshot.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&dir)?;
        // snapshots/<commit>/a/b.gguf -> ../../../blobs/<sha> (one more .. per folder).
        let depth = f.path.matches('/').count() + 2;
        let target = PathBuf::from("../".repeat(depth))
            .join("blobs")
            .join(&f.sha256);
        let tmp = dir.join(format!(".{}.link", f.sha256));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        std::fs::rename(&tmp, &snapshot)
    }

    /// Free bytes on the store's filesystem.
    pub fn free_space(&self) -> io::Result<u64> {
        free_space(&self.root)
    }

    /// The size and free bytes of the store's filesystem.
    pub fn filesystem(&self) -> io::Result<(u64, u64)> {
        let s = rustix::fs::statvfs(&self.root)?;
        Ok((
            s.f_blocks.saturating_mul(s.f_frsize),
            s.f_bavail.saturating_mul(s.f_frsize),
        ))
    }

    /// Whether a verified blob of this content is on disk.
    pub fn has_blob(&self, sha256: &str) -> bool {
        self.verified(sha256).is_file()
    }

    /// Every verified blob (each content once), at most [`MAX_BLOBS`] of them.
    pub fn blobs(&self) -> io::Result<Vec<super::space::Blob>> {
        self.list(".by-sha256", "", |m| m.len())
    }

    /// Bytes the partial downloads hold on disk now.
    pub fn partial_bytes(&self) -> io::Result<u64> {
        Ok(self.incomplete()?.bytes)
    }

    /// The partial downloads: each one's sha256, bytes on disk and when it was last written.
    #[cfg(test)]
    pub fn partials(&self) -> io::Result<Vec<super::space::Blob>> {
        Ok(self.incomplete()?.partials)
    }

    /// The partial downloads' folder in one listing: all its bytes, and the downloads.
    pub fn incomplete(&self) -> io::Result<Incomplete> {
        let mut found = Incomplete::default();
        for entry in std::fs::read_dir(self.root.join(".incomplete"))?.take(MAX_BLOBS) {
            let entry = entry?;
            // A download that finished (renamed away) since the listing is no longer partial.
            let meta = match entry.metadata() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                m => m?,
            };
            if !meta.is_file() {
                continue;
            }
            found.bytes = found.bytes.saturating_add(on_disk(&meta));
            if let Some(sha) = sha_named(&entry.file_name(), ".part") {
                found.partials.push(super::space::Blob {
                    sha256: sha,
                    size: on_disk(&meta),
                    modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                });
            }
        }
        Ok(found)
    }

    /// The files of `folder` named by a sha256 and `suffix`, at most [`MAX_BLOBS`], each with
    /// the size `size` gives and when it was last written.
    fn list(
        &self,
        folder: &str,
        suffix: &str,
        size: impl Fn(&std::fs::Metadata) -> u64,
    ) -> io::Result<Vec<super::space::Blob>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.root.join(folder))?.take(MAX_BLOBS) {
            let entry = entry?;
            let Some(sha) = sha_named(&entry.file_name(), suffix) else {
                continue;
            };
            let meta = entry.metadata()?;
            if meta.is_file() {
                out.push(super::space::Blob {
                    sha256: sha,
                    size: size(&meta),
                    modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                });
            }
        }
        Ok(out)
    }

    /// Deletes a partial download and its ledger.
    pub fn remove_partial(&self, sha256: &str) -> io::Result<()> {
        let part = self.partial(sha256);
        for path in [part.with_extension("segments"), part] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Deletes a blob and every name of it: the snapshot links that resolve to it in any
    /// repository and commit, the repositories' blob links, and `.by-sha256`. Folders left empty
    /// go too. Returns how many snapshot links pointed at it.
    pub fn remove_blob(&self, sha256: &str) -> io::Result<usize> {
        let mut links = 0;
        for repo in std::fs::read_dir(&self.root)?.take(MAX_BLOBS) {
            let repo = repo?.path();
            let is_repo = repo
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("models--"));
            if !is_repo {
                continue;
            }
            let snapshots = repo.join("snapshots");
            if snapshots.is_dir() {
                links += unlink_to(&snapshots, sha256, 0)?;
            }
            match std::fs::remove_file(repo.join("blobs").join(sha256)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let _ = std::fs::remove_dir(repo.join("blobs"));
            let _ = std::fs::remove_dir(&snapshots);
            let _ = std::fs::remove_dir(&repo);
        }
        match std::fs::remove_file(self.verified(sha256)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(links),
        }
    }
}

/// The sha256 of a file named `<sha256><suffix>`, if it is one.
fn sha_named(name: &std::ffi::OsStr, suffix: &str) -> Option<String> {
    let sha = name.to_str()?.strip_suffix(suffix)?;
    (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sha.to_string())
}

/// The partial downloads' folder, listed once.
#[derive(Debug, Default)]
pub struct Incomplete {
    /// Everything in it on disk: the downloads and their ledgers.
    pub bytes: u64,
    /// The downloads (`<sha256>.part`).
    pub partials: Vec<super::space::Blob>,
}

/// Bytes a file holds on disk: a partial download is sparse where its segments have not landed.
fn on_disk(m: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    m.blocks().saturating_mul(512).min(m.len())
}

/// The most entries one listing of the store reads.
pub const MAX_BLOBS: usize = 100_000;

/// Removes the links under `dir` whose target is a blob named `sha256`, and folders left empty;
/// `depth` bounds the walk (paths are validated to fewer folders than this).
fn unlink_to(dir: &Path, sha256: &str, depth: usize) -> io::Result<usize> {
    if depth > 64 {
        return Ok(0);
    }
    let mut n = 0;
    for entry in std::fs::read_dir(dir)?.take(MAX_BLOBS) {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&path)?;
            if target.file_name().and_then(|n| n.to_str()) == Some(sha256) {
                std::fs::remove_file(&path)?;
                n += 1;
            }
        } else if kind.is_dir() {
            n += unlink_to(&path, sha256, depth + 1)?;
            // Only succeeds once empty.
            let _ = std::fs::remove_dir(&path);
        }
    }
    Ok(n)
}

/// Free bytes (for an unprivileged writer) on the filesystem holding `path`.
pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> FileRef {
        FileRef {
            repo: "o/r".into(),
            commit: "a".repeat(40),
            path: path.into(),
            sha256: "b".repeat(64),
            size: 3,
        }
    }

    #[test]
    fn traversal_and_unpinned_refs_are_refused() {
        assert!(file("m.gguf").validate().is_ok());
        assert!(file("../m.gguf").validate().is_err());
        assert!(file("/etc/passwd").validate().is_err());
        assert!(
            FileRef {
                repo: "../x".into(),
                ..file("m.gguf")
            }
            .validate()
            .is_err()
        );
        assert!(
            FileRef {
                commit: "main".into(),
                ..file("m.gguf")
            }
            .validate()
            .is_err()
        );
        assert!(
            FileRef {
                sha256: "B".repeat(64),
                ..file("m.gguf")
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn one_listing_gives_the_partial_downloads_and_all_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sha = "c".repeat(64);
        std::fs::write(store.partial(&sha), b"abc").unwrap();
        std::fs::write(store.partial(&sha).with_extension("segments"), b"x").unwrap();
        std::fs::write(dir.path().join(".incomplete/stray.part"), b"y").unwrap();
        let found = store.incomplete().unwrap();
        let names: Vec<&str> = found.partials.iter().map(|b| b.sha256.as_str()).collect();
        assert_eq!(names, [sha.as_str()], "only downloads named by a sha256");
        let bytes: u64 = std::fs::read_dir(dir.path().join(".incomplete"))
            .unwrap()
            .map(|e| on_disk(&e.unwrap().metadata().unwrap()))
            .sum();
        assert_eq!(
            found.bytes, bytes,
            "the ledger and the stray file count too"
        );
        assert_eq!(store.partial_bytes().unwrap(), bytes);
    }

    #[test]
    fn a_committed_blob_appears_in_the_hf_layout_and_is_adopted_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let f = file("Q4/m.gguf");
        assert!(!store.present(&f));
        std::fs::write(store.partial(&f.sha256), b"abc").unwrap();
        store.commit(&f).unwrap();
        assert!(store.present(&f));
        let snap = dir.path().join(format!(
            "models--o--r/snapshots/{}/Q4/m.gguf",
            "a".repeat(40)
        ));
        assert_eq!(
            std::fs::read_link(&snap).unwrap(),
            PathBuf::from(format!("../../../blobs/{}", "b".repeat(64)))
        );
        assert_eq!(std::fs::read(&snap).unwrap(), b"abc");
        let other = FileRef {
            repo: "x/y".into(),
            path: "m.gguf".into(),
            ..f.clone()
        };
        assert!(
            store.adopt(&other).unwrap(),
            "the same content in another repo is linked, not fetched"
        );
        assert!(store.present(&other));
        assert_eq!(store.blobs().unwrap().len(), 1, "one content, one blob");

        // Deleting the content removes every name of it, in both repositories.
        assert_eq!(store.remove_blob(&f.sha256).unwrap(), 2);
        assert!(!store.present(&f) && !store.present(&other));
        assert!(store.blobs().unwrap().is_empty());
        assert!(
            !dir.path().join("models--o--r").exists(),
            "empty folders go"
        );
        assert_eq!(
            store.remove_blob(&f.sha256).unwrap(),
            0,
            "twice is harmless"
        );
    }
}

//! GGUF: reading the header of a model over HTTP ranges or from a file, which llama.cpp build
//! loads it, and how much memory a replica needs. Every count a header gives is checked
//! against its bound (`bounds`) before it is used: headers come from arbitrary repositories.

pub mod bounds;
pub mod header;
pub mod hparams;
pub mod inspect;
pub mod memory;
pub mod offload;
pub mod support;

use bounds::{MAX_HEADER, MAX_TENSORS};
use header::{GgufError, Header};

use crate::hub::{Hub, HubError};

/// The first read; most headers fit, and a bigger one costs one or two more reads.
pub const FIRST_READ: u64 = 4 << 20;

/// Where header bytes come from.
pub trait ByteSource {
    /// Up to `len` bytes at `offset`; fewer only at the end of the file.
    fn read_at(
        &mut self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> + Send;
}

/// A failure of the byte source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{file}: {source}")]
    Invalid {
        file: String,
        #[source]
        source: GgufError,
    },
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl ReadError {
    /// The condition reason: the registry's, `InvalidHeader` for a count beyond its bound,
    /// `InvalidGGUF` for anything else wrong with the file.
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::Invalid { source, .. } => source.reason(),
            ReadError::Source(SourceError::Hub(h)) => h.reason(),
            ReadError::Source(SourceError::Io { .. }) => "InvalidGGUF",
        }
    }
}

/// A header and how many bytes were fetched to read it.
#[derive(Clone, Debug)]
pub struct Read {
    pub header: Header,
    pub fetched: u64,
}

/// Reads the header from `src`, growing the read until the header parses; never the tensor
/// data. The header is parsed and its counts checked (`hparams::validate`) on tokio's blocking
/// pool, so a large header never holds up a runtime worker.
pub async fn read_header(src: &mut impl ByteSource, file: &str) -> Result<Read, ReadError> {
    let invalid = |source| ReadError::Invalid {
        file: file.into(),
        source,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut want = FIRST_READ;
    let mut eof = false;
    loop {
        if !eof && (buf.len() as u64) < want {
            let asked = want - buf.len() as u64;
            let mut more = src.read_at(buf.len() as u64, asked).await?;
            eof = (more.len() as u64) < asked;
            more.truncate(usize::try_from(asked).unwrap_or(usize::MAX));
            buf.extend_from_slice(&more);
        }
        let (parsed, back) = tokio::task::spawn_blocking(move || {
            let parsed = header::parse(&buf, eof)
                .and_then(|h| hparams::validate(&h).map(|()| h).map_err(GgufError::from));
            (parsed, buf)
        })
        .await
        .map_err(|e| invalid(GgufError::ParserFailed(e.to_string())))?;
        buf = back;
        match parsed {
            Ok(header) => {
                return Ok(Read {
                    header,
                    fetched: buf.len() as u64,
                });
            }
            Err(e) => match e.needs_more() {
                Some(needed) if !eof && (buf.len() as u64) < MAX_HEADER => {
                    want = needed.max(2 * buf.len() as u64).min(MAX_HEADER);
                }
                _ => return Err(invalid(e)),
            },
        }
    }
}

/// Adds a shard to a model: the first gives the metadata, every shard its tensors, at most
/// `MAX_TENSORS` in all.
pub fn merge(model: &mut Option<Header>, shard: Header, file: &str) -> Result<(), ReadError> {
    let Some(m) = model.as_mut() else {
        *model = Some(shard);
        return Ok(());
    };
    let n = (m.tensors.len() as u64).saturating_add(shard.tensors.len() as u64);
    bounds::at_most(n, MAX_TENSORS, "tensors", || {
        "the tensor count of all shards".into()
    })
    .map_err(|e| ReadError::Invalid {
        file: file.into(),
        source: e.into(),
    })?;
    m.tensors.extend(shard.tensors);
    Ok(())
}

/// A file on the registry at a pinned commit, read through Range requests.
pub struct HubSource<'a> {
    pub hub: &'a Hub,
    pub repo: &'a str,
    pub commit: &'a str,
    pub path: &'a str,
}

impl ByteSource for HubSource<'_> {
    async fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        match self
            .hub
            .read_range(self.repo, self.commit, self.path, offset, len)
            .await
        {
            Ok(b) => Ok(b),
            // A range past the end of a file shorter than the first read.
            Err(HubError::Malformed { what })
                if what.starts_with("a byte range beyond the end") =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// A local file.
pub struct FileSource {
    pub path: std::path::PathBuf,
}

impl ByteSource for FileSource {
    async fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let io = |source| SourceError::Io {
            path: self.path.display().to_string(),
            source,
        };
        let mut f = tokio::fs::File::open(&self.path).await.map_err(io)?;
        f.seek(std::io::SeekFrom::Start(offset)).await.map_err(io)?;
        let mut out = Vec::new();
        f.take(len).read_to_end(&mut out).await.map_err(io)?;
        Ok(out)
    }
}

/// The header of a (possibly split) model: metadata from the first shard, tensor infos from all,
/// with the counts of all shards together checked.
pub async fn read_model(
    hub: &Hub,
    repo: &str,
    commit: &str,
    paths: &[String],
) -> Result<(Header, u64), ReadError> {
    let mut merged: Option<Header> = None;
    let mut fetched = 0u64;
    for path in paths {
        let mut src = HubSource {
            hub,
            repo,
            commit,
            path,
        };
        let read = read_header(&mut src, path).await?;
        fetched = fetched.saturating_add(read.fetched);
        merge(&mut merged, read.header, path)?;
    }
    let invalid = |source| ReadError::Invalid {
        file: repo.into(),
        source,
    };
    let header = merged.ok_or_else(|| invalid(GgufError::Truncated { needed: 4, len: 0 }))?;
    hparams::tensors(&header).map_err(|e| invalid(e.into()))?;
    Ok((header, fetched))
}

#[cfg(test)]
mod tests {
    use super::header::{Value, write};
    use super::*;

    struct Mem {
        bytes: Vec<u8>,
        reads: Vec<(u64, u64)>,
    }

    impl ByteSource for Mem {
        async fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
            self.reads.push((offset, len));
            let start = (offset as usize).min(self.bytes.len());
            let end = (offset.saturating_add(len) as usize).min(self.bytes.len());
            Ok(self.bytes[start..end].to_vec())
        }
    }

    #[tokio::test]
    async fn a_big_header_is_read_in_growing_ranges_and_never_past_what_it_needs() {
        let tokens: Vec<String> = (0..400_000).map(|i| format!("token-{i}")).collect();
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut bytes = write::header(
            &[
                ("general.architecture", Value::String("llama".into())),
                ("tokenizer.ggml.tokens", write::strings(&refs)),
            ],
            &[("t", &[32], 0)],
        );
        let header_len = bytes.len() as u64;
        bytes.resize(bytes.len() + (100 << 20), 0); // 100 MiB of "tensor data" that must not be read
        let mut src = Mem {
            bytes,
            reads: vec![],
        };
        let read = read_header(&mut src, "m.gguf").await.unwrap();
        assert_eq!(
            read.header
                .get("tokenizer.ggml.tokens")
                .and_then(Value::array_len),
            Some(400_000)
        );
        assert!(
            header_len > FIRST_READ,
            "the test needs a header bigger than the first read"
        );
        assert!(
            read.fetched <= header_len + FIRST_READ * 2,
            "fetched {} for a {header_len}-byte header",
            read.fetched
        );
        assert!(src.reads.len() <= 3, "{:?}", src.reads);
        assert_eq!(src.reads[0], (0, FIRST_READ));
    }

    #[tokio::test]
    async fn a_truncated_file_is_an_error_naming_the_file() {
        let bytes = write::header(
            &[("general.architecture", Value::String("llama".into()))],
            &[("t", &[32], 0)],
        );
        let mut src = Mem {
            bytes: bytes[..bytes.len() - 3].to_vec(),
            reads: vec![],
        };
        let e = read_header(&mut src, "cut.gguf").await.unwrap_err();
        assert!(
            e.to_string().starts_with("cut.gguf: the file ends at byte"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_hostile_header_is_refused_on_the_blocking_pool_naming_field_and_limit() {
        let bytes = write::header(
            &[
                ("general.architecture", Value::String("llama".into())),
                ("llama.block_count", Value::U32(0xFFFF_FFF0)),
            ],
            &[("t", &[32], 0)],
        );
        let mut src = Mem {
            bytes,
            reads: vec![],
        };
        let start = std::time::Instant::now();
        let e = read_header(&mut src, "evil.gguf").await.unwrap_err();
        assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
        assert_eq!(e.reason(), "InvalidHeader");
        assert_eq!(
            e.to_string(),
            "evil.gguf: llama.block_count is 4294967280, above the limit of 4096 layers"
        );
    }
}

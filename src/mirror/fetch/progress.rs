//! What everyone asking for one file sees of it: its state, bytes done, speed and error.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::mirror::store::FileRef;

/// States a file goes through on the mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Downloading,
    Verifying,
    Present,
    Failed,
}

impl State {
    /// The name the API reports (`queued`, `downloading`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Downloading => "downloading",
            State::Verifying => "verifying",
            State::Present => "present",
            State::Failed => "failed",
        }
    }
}

/// Live progress of one file, shared by everyone asking for it.
#[derive(Debug)]
pub struct Progress {
    pub file: FileRef,
    pub state: Mutex<State>,
    pub bytes_done: AtomicU64,
    pub error: Mutex<Option<String>>,
    pub started: Instant,
    /// Bytes that came over the network (not resumed from disk), for speed.
    pub fetched: AtomicU64,
}

impl Progress {
    pub fn new(file: FileRef) -> Progress {
        Progress {
            file,
            state: Mutex::new(State::Queued),
            bytes_done: AtomicU64::new(0),
            error: Mutex::new(None),
            started: Instant::now(),
            fetched: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, s: State) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn fail(&self, error: String) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.set(State::Failed);
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bytes per second over the network since the download started.
    pub fn speed(&self) -> u64 {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        (self.fetched.load(Ordering::Relaxed) as f64 / secs) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn states_are_reported_by_their_serialized_names() {
        for s in [
            State::Queued,
            State::Downloading,
            State::Verifying,
            State::Present,
            State::Failed,
        ] {
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::from(s.as_str())
            );
        }
    }
}

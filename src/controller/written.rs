//! The status writes the ModelServe cache has not shown yet. A reconcile compares the status it
//! decides with the object's status in the cache; right after a write, the cache may still hold
//! the object as it was before that write, so a reconcile woken then (a Deployment or pod event)
//! would send the same status again. Each write is remembered with the resourceVersion it was
//! decided from, until the cache holds a newer version of the object.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::api::{ModelServe, ModelServeStatus};

/// Pending writes kept at most; past it they are forgotten, which costs at most one repeated
/// write each.
const MAX_PENDING: usize = 4096;

#[derive(Default)]
pub struct Written {
    pending: Mutex<HashMap<ObjectRef<ModelServe>, Pending>>,
}

struct Pending {
    /// The resourceVersion of the cached object the write was decided from.
    from: Option<String>,
    status: u64,
}

impl Written {
    /// Whether `status` is what this operator last wrote for `ms` while the cache still holds
    /// the version of `ms` that write was decided from.
    pub fn already_sent(&self, ms: &ModelServe, status: &ModelServeStatus) -> bool {
        let key = ObjectRef::from(ms);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = pending.get(&key) else {
            return false;
        };
        if p.from != ms.metadata.resource_version {
            // The cache moved on: it shows that write, or something newer to decide from.
            pending.remove(&key);
            return false;
        }
        p.status == digest(status)
    }

    /// Remembers that `status` was written for `ms` as cached now.
    pub fn sent(&self, ms: &ModelServe, status: &ModelServeStatus) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() >= MAX_PENDING {
            pending.clear();
        }
        pending.insert(
            ObjectRef::from(ms),
            Pending {
                from: ms.metadata.resource_version.clone(),
                status: digest(status),
            },
        );
    }
}

fn digest(status: &ModelServeStatus) -> u64 {
    let mut h = DefaultHasher::new();
    // The serialized form is what is written; it always serializes (plain data).
    serde_json::to_vec(status).unwrap_or_default().hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelServeSpec;

    fn model(version: &str) -> ModelServe {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap();
        let mut ms = ModelServe::new("m", spec);
        ms.metadata.namespace = Some("ns".into());
        ms.metadata.resource_version = Some(version.into());
        ms
    }

    fn status(ready: i32) -> ModelServeStatus {
        ModelServeStatus {
            ready_replicas: ready,
            ..Default::default()
        }
    }

    #[test]
    fn a_status_written_is_not_sent_again_while_the_cache_lags_behind_it() {
        let w = Written::default();
        let cached = model("10");
        assert!(!w.already_sent(&cached, &status(1)), "nothing written yet");
        w.sent(&cached, &status(1));
        assert!(
            w.already_sent(&cached, &status(1)),
            "the cache still shows version 10: the same status is not sent again"
        );
        assert!(
            !w.already_sent(&cached, &status(2)),
            "a different status is written"
        );
    }

    #[test]
    fn once_the_cache_moves_on_the_cached_status_decides_again() {
        let w = Written::default();
        w.sent(&model("10"), &status(1));
        // Someone else reset the status after our write: version 12 is compared as usual.
        assert!(!w.already_sent(&model("12"), &status(1)));
        // And the entry is gone, even back at the old version.
        assert!(!w.already_sent(&model("10"), &status(1)));
    }

    #[test]
    fn another_object_has_nothing_pending() {
        let w = Written::default();
        w.sent(&model("10"), &status(1));
        let mut other = model("10");
        other.metadata.name = Some("other".into());
        assert!(!w.already_sent(&other, &status(1)));
    }

    #[test]
    fn pending_writes_stay_bounded() {
        let w = Written::default();
        for i in 0..(MAX_PENDING + 10) {
            let mut ms = model("1");
            ms.metadata.name = Some(format!("m{i}"));
            w.sent(&ms, &status(1));
        }
        assert!(w.pending.lock().unwrap().len() <= MAX_PENDING);
    }
}

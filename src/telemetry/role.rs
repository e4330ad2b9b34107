//! How this replica stands among the operator's replicas: what /readyz and the
//! `modelserve_leader` gauge report, and what leader election sets.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// How this replica stands, for /readyz and the `modelserve_leader` gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// Leader election is off: this replica runs the controller.
    Alone = 0,
    /// Waiting for the Lease another replica holds.
    Standby = 1,
    /// Holding the Lease and running the controller.
    Leader = 2,
}

/// The role, shared with the health server.
#[derive(Clone, Debug)]
pub struct RoleCell(Arc<AtomicU8>);

impl Default for RoleCell {
    fn default() -> Self {
        RoleCell(Arc::new(AtomicU8::new(Role::Alone as u8)))
    }
}

impl RoleCell {
    pub fn get(&self) -> Role {
        match self.0.load(Ordering::Relaxed) {
            1 => Role::Standby,
            2 => Role::Leader,
            _ => Role::Alone,
        }
    }

    pub fn set(&self, role: Role) {
        self.0.store(role as u8, Ordering::Relaxed);
    }

    /// Whether this replica runs the controller.
    pub fn leads(&self) -> bool {
        self.get() != Role::Standby
    }
}

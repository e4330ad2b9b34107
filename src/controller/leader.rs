//! Leader election on a coordination.k8s.io Lease: of the operator's replicas only the one that
//! holds the Lease runs the controller, so two never write the same status; the others wait,
//! sending nothing but their Lease requests, and take over within a lease duration of the
//! leader's death (listing their watch caches then, as kube-runtime's controller drives them).
//!
//! kube-lease-manager acquires and renews the Lease. On top of it a fence reads the Lease back
//! on its own clock: when the Lease names another holder, or this replica's last renewal is
//! older than the fence allows (the API server unreachable, a renewal stuck), the leader stops at
//! once, before a standby may take the Lease over.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use k8s_openapi::jiff;

use crate::Error;
use crate::units::{human_duration, parse_duration};

/// The leader-election flags of `modelserve controller`.
#[derive(Clone, Debug, clap::Args)]
pub struct LeaderArgs {
    /// Run the controller only while holding the Lease, so that of several replicas one writes;
    /// `--leader-elect=false` runs it at once, for a single operator.
    #[arg(long = "leader-elect", env = "MODELSERVE_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Name of the coordination.k8s.io Lease the replicas share.
    #[arg(
        long,
        env = "MODELSERVE_LEASE_NAME",
        default_value = "modelserve-operator"
    )]
    pub lease_name: String,
    /// Namespace of the Lease (default: the watched namespace, else the pod's own from
    /// POD_NAMESPACE, else `default`).
    #[arg(long, env = "MODELSERVE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long the Lease holds without a renewal: a standby takes over this long after the
    /// leader died. The leader renews after about two thirds of it, and stops when a sixth more
    /// passes without one. Between 3s and 10m.
    #[arg(long, env = "MODELSERVE_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
}

const MIN_DURATION: Duration = Duration::from_secs(3);
const MAX_DURATION: Duration = Duration::from_secs(600);

impl LeaderArgs {
    /// Checks the flags; the error names the flag and what would be valid.
    pub fn validate(&self) -> Result<(), Error> {
        if !(MIN_DURATION..=MAX_DURATION).contains(&self.lease_duration) {
            return Err(Error::BadFlag {
                flag: "--lease-duration",
                message: format!(
                    "{} is out of range; give a duration between {} and {}",
                    human_duration(self.lease_duration),
                    human_duration(MIN_DURATION),
                    human_duration(MAX_DURATION)
                ),
            });
        }
        if !is_object_name(&self.lease_name) {
            return Err(Error::BadFlag {
                flag: "--lease-name",
                message: format!(
                    "{:?} is not a valid object name; use up to 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
                    self.lease_name
                ),
            });
        }
        Ok(())
    }

    /// The Lease's namespace: the flag, else the watched namespace, else the pod's, else default.
    pub fn namespace(&self, watched: Option<&str>) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| watched.map(str::to_string))
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".into())
    }
}

/// A DNS subdomain, as Kubernetes wants object names.
fn is_object_name(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    s.len() <= 253
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The timings derived from the lease duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub duration: Duration,
    /// The crate renews this long before the Lease would expire.
    pub grace: Duration,
    /// The fence stops the leader when its last renewal is this old (between the renewal and
    /// the expiry).
    pub fence: Duration,
    /// How often the fence reads the Lease.
    pub poll: Duration,
}

impl Timings {
    pub fn of(duration: Duration) -> Timings {
        let secs = duration.as_secs().max(3);
        let duration = Duration::from_secs(secs);
        // The crate renews `grace` before expiry, in whole seconds as the Lease counts them: at
        // two thirds of the duration or a little later.
        let grace = Duration::from_secs((secs / 3).max(1));
        Timings {
            duration,
            grace,
            // Halfway between the renewal and the expiry: late enough that a renewal a little
            // slow is seen, early enough that the leader has stopped before anyone may take over.
            fence: duration - grace / 2,
            poll: (duration / 6).max(FENCE_READ),
        }
    }
}

/// The least time one read of the Lease gets, even at the fence.
const FENCE_READ: Duration = Duration::from_millis(250);

/// This replica's identity in the Lease: the pod's name, else host name and process ID.
pub fn identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "modelserve".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

/// A running election: the crate's task, its channel, and where the Lease lives.
pub struct Election {
    pub identity: String,
    pub namespace: String,
    pub name: String,
    pub timings: Timings,
    api: Api<Lease>,
    leading: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
}

impl Election {
    /// Starts competing for the Lease (created when missing).
    pub async fn start(
        client: Client,
        args: &LeaderArgs,
        namespace: String,
    ) -> Result<Election, Error> {
        let identity = identity();
        let timings = Timings::of(args.lease_duration);
        let params = LeaseParams::new(
            identity.clone(),
            timings.duration.as_secs(),
            timings.grace.as_secs(),
        )
        .with_field_manager(format!("modelserve-{identity}"));
        let manager = LeaseManagerBuilder::new(client.clone(), args.lease_name.clone())
            .with_namespace(namespace.clone())
            .with_parameters(params)
            .build()
            .await
            .map_err(|e| Error::Lease {
                lease: format!("{namespace}/{}", args.lease_name),
                message: e.to_string(),
            })?;
        let (leading, task) = manager.watch().await;
        Ok(Election {
            identity,
            api: Api::namespaced(client, &namespace),
            namespace,
            name: args.lease_name.clone(),
            timings,
            leading,
            task,
        })
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquired(&mut self) -> Result<(), Error> {
        let holder = self.holder().await;
        info!(lease = %self.lease(), identity = %self.identity, holder = holder.as_deref().unwrap_or("nobody"), "standby: waiting for the lease");
        let lease = self.lease();
        self.leading
            .wait_for(|leading| *leading)
            .await
            .map_err(|_| Error::Lease {
                lease,
                message: "the lease manager stopped".into(),
            })?;
        info!(lease = %self.lease(), identity = %self.identity, "acquired the lease; leading");
        Ok(())
    }

    async fn holder(&self) -> Option<String> {
        self.api
            .get_opt(&self.name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    /// Resolves, with the reason, as soon as this replica may no longer act as the leader: the
    /// crate reports the Lease lost, the Lease names another holder, or this replica's last
    /// renewal is older than the fence allows (however the Lease could not be read).
    pub async fn lost(&mut self) -> String {
        let t = self.timings;
        let lease = self.lease();
        // The crate has just written the Lease when it reports it held.
        let mut deadline = Instant::now() + t.fence;
        loop {
            let wait = t
                .poll
                .min(deadline.saturating_duration_since(Instant::now()));
            tokio::select! {
                r = self.leading.wait_for(|leading| !*leading) => {
                    return match r {
                        Ok(_) => format!("the lease manager reports the Lease {lease} lost"),
                        Err(_) => format!("the lease manager of {lease} stopped"),
                    };
                }
                _ = tokio::time::sleep(wait) => {}
            }
            // An API server that does not answer must not hold the fence open: the read gets
            // until the deadline (a quarter second at least, still before the expiry).
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(FENCE_READ);
            match tokio::time::timeout(left, self.api.get(&self.name)).await {
                Ok(Ok(lease)) => {
                    match fence_deadline(&lease, &self.identity, t, jiff::Timestamp::now()) {
                        Ok(left) => deadline = Instant::now() + left,
                        Err(why) => return format!("the Lease {} {why}", self.lease()),
                    }
                }
                Ok(Err(e)) => {
                    warn!(lease = %self.lease(), error = %e, "cannot read the lease back")
                }
                Err(_) => warn!(lease = %self.lease(), "reading the lease back timed out"),
            }
            if Instant::now() >= deadline {
                return format!(
                    "the Lease {} was not confirmed renewed within the fence of {}",
                    self.lease(),
                    human_duration(t.fence)
                );
            }
        }
    }

    /// Stops competing without giving the Lease up, for a replica that lost it: the lease
    /// manager's release, which runs once its channel closes, clears the holder without a
    /// precondition where its cached state still names this replica, and so wiped the claim
    /// of the replica that had taken the Lease over (tests/leader.rs). The task ends before
    /// the channel closes, so that release never runs.
    pub async fn abandon(self) {
        let lease = self.lease();
        self.task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        drop(self.leading);
        info!(%lease, "left the lease to its holder");
    }

    /// Gives the Lease up, so a standby takes over at once (on a clean shutdown).
    pub async fn release(self) {
        let lease = self.lease();
        drop(self.leading);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) => info!(%lease, "released the lease"),
            Ok(Ok(Err(e))) => warn!(%lease, error = %e, "could not release the lease"),
            Ok(Err(e)) => warn!(%lease, error = %e, "the lease manager failed"),
            Err(_) => warn!(%lease, "releasing the lease took over 5s; it expires on its own"),
        }
    }
}

/// How long this replica may still act as the leader, from the Lease as the API server holds
/// it, or why it may not at all.
pub fn fence_deadline(
    lease: &Lease,
    me: &str,
    t: Timings,
    now: jiff::Timestamp,
) -> Result<Duration, String> {
    let spec = lease.spec.as_ref().ok_or("has no spec")?;
    match spec.holder_identity.as_deref() {
        Some(h) if h == me => {}
        Some(h) if !h.is_empty() => return Err(format!("is held by {h} now")),
        _ => return Err("has no holder now".into()),
    }
    let renewed = spec.renew_time.as_ref().ok_or("has no renewTime")?.0;
    let age = now.duration_since(renewed);
    // A renewal stamped in the future (another clock) counts as just now.
    let age = Duration::try_from(age).unwrap_or(Duration::ZERO);
    t.fence
        .checked_sub(age)
        .filter(|left| !left.is_zero())
        .ok_or_else(|| {
            format!(
                "was last renewed {} ago, past the fence of {}",
                human_duration(age),
                human_duration(t.fence)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed: jiff::Timestamp) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_fence_stops_the_leader_before_a_standby_may_take_over() {
        let t = Timings::of(Duration::from_secs(15));
        assert_eq!(t.grace, Duration::from_secs(5), "renews at 10s");
        assert!(
            t.fence > t.duration - t.grace,
            "the fence is after the renewal"
        );
        assert!(t.fence < t.duration, "and before the Lease expires");
        let now = jiff::Timestamp::now();
        let fresh = lease(Some("me"), now - jiff::SignedDuration::from_secs(2));
        let left = fence_deadline(&fresh, "me", t, now).unwrap();
        assert_eq!(left, Duration::from_millis(10_500));
        let short = Timings::of(Duration::from_secs(4));
        assert_eq!(
            (short.grace, short.fence),
            (Duration::from_secs(1), Duration::from_millis(3500))
        );
        let stale = lease(Some("me"), now - jiff::SignedDuration::from_secs(13));
        let why = fence_deadline(&stale, "me", t, now).unwrap_err();
        assert!(why.contains("last renewed 13s ago"), "{why}");
    }

    #[test]
    fn a_lease_held_by_another_replica_ends_leadership() {
        let t = Timings::of(Duration::from_secs(15));
        let now = jiff::Timestamp::now();
        let why = fence_deadline(&lease(Some("other-1"), now), "me", t, now).unwrap_err();
        assert_eq!(why, "is held by other-1 now");
        let why = fence_deadline(&lease(None, now), "me", t, now).unwrap_err();
        assert_eq!(why, "has no holder now");
        let future = lease(Some("me"), now + jiff::SignedDuration::from_secs(3));
        assert_eq!(fence_deadline(&future, "me", t, now).unwrap(), t.fence);
    }

    #[test]
    fn lease_flags_outside_their_range_name_the_flag() {
        let args = LeaderArgs {
            enabled: true,
            lease_name: "modelserve-operator".into(),
            lease_namespace: None,
            lease_duration: Duration::from_secs(1),
        };
        let e = args.validate().unwrap_err().to_string();
        assert!(e.starts_with("--lease-duration: 1s is out of range"), "{e}");
        let bad = LeaderArgs {
            lease_name: "Not_A_Name".into(),
            lease_duration: Duration::from_secs(15),
            ..args
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--lease-name")
        );
    }

    #[test]
    fn the_lease_lives_in_the_watched_namespace_unless_told() {
        let args = LeaderArgs {
            enabled: true,
            lease_name: "l".into(),
            lease_namespace: None,
            lease_duration: Duration::from_secs(15),
        };
        assert_eq!(args.namespace(Some("team-a")), "team-a");
        let told = LeaderArgs {
            lease_namespace: Some("ops".into()),
            ..args
        };
        assert_eq!(told.namespace(Some("team-a")), "ops");
    }
}

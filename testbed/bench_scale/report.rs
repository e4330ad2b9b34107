//! The benchmark's result: one row per number of models, printed as a table with the goals,
//! and the API server's counts beside it as a cross-check.

use std::time::Duration;

use crate::prom::Requests;

/// One row of the table.
#[derive(Default)]
pub struct Row {
    pub models: u32,
    pub on_demand: OnDemand,
    pub rss_peak: Option<u64>,
    pub rss_settled: Option<u64>,
    pub operator_idle: Option<Requests>,
    pub apiserver_idle: Option<Requests>,
    pub apiserver_ours_idle: Option<Requests>,
    pub latencies: Vec<Duration>,
    pub missed: usize,
}

/// How long until all were OnDemand, or how many were by the timeout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OnDemand {
    After(Duration),
    Partly { done: usize, by: Duration },
}

impl Default for OnDemand {
    fn default() -> Self {
        OnDemand::Partly {
            done: 0,
            by: Duration::ZERO,
        }
    }
}

/// `3m07s`, `45.2s`
pub fn minutes(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

fn mib(b: Option<u64>) -> String {
    b.map_or("?".into(), |b| {
        format!("{:.0} MiB", b as f64 / f64::from(1u32 << 20))
    })
}

fn per_min(r: Option<Requests>, pick: impl Fn(&Requests) -> f64) -> String {
    r.map_or("n/a".into(), |r| format!("{:.1}", pick(&r)))
}

/// The q-quantile (nearest rank) of the latencies as text; a change never observed counts as
/// slower than any.
fn latency(row: &Row, q: f64) -> String {
    let mut all = row.latencies.clone();
    all.sort();
    let total = all.len() + row.missed;
    if total == 0 {
        return "-".into();
    }
    let rank = ((q * total as f64).ceil() as usize).max(1);
    match all.get(rank - 1) {
        Some(d) => format!("{} ms", d.as_millis()),
        None => ">30 s".into(),
    }
}

/// The result table, and the API server's counts as a cross-check.
pub fn table(rows: &[Row]) -> String {
    let mut main = vec![vec![
        "models".to_string(),
        "all OnDemand after".into(),
        "RSS peak / settled".into(),
        "idle reads/min".into(),
        "idle writes/min".into(),
        "idle watch renewals/min".into(),
        "p50".into(),
        "p99".into(),
    ]];
    let mut check = vec![vec![
        "models".to_string(),
        "apiserver reads/min".into(),
        "apiserver writes/min".into(),
        "apiserver watches/min".into(),
        "modelserve.dev reads/min".into(),
        "modelserve.dev writes/min".into(),
    ]];
    for r in rows {
        let on_demand = match r.on_demand {
            OnDemand::After(d) => minutes(d),
            OnDemand::Partly { done, by } => format!("{done}/{} by {}", r.models, minutes(by)),
        };
        main.push(vec![
            r.models.to_string(),
            on_demand,
            format!("{} / {}", mib(r.rss_peak), mib(r.rss_settled)),
            per_min(r.operator_idle, |r| r.reads),
            per_min(r.operator_idle, |r| r.writes),
            per_min(r.operator_idle, |r| r.watches),
            latency(r, 0.5),
            latency(r, 0.99),
        ]);
        check.push(vec![
            r.models.to_string(),
            per_min(r.apiserver_idle, |r| r.reads),
            per_min(r.apiserver_idle, |r| r.writes),
            per_min(r.apiserver_idle, |r| r.watches),
            per_min(r.apiserver_ours_idle, |r| r.reads),
            per_min(r.apiserver_ours_idle, |r| r.writes),
        ]);
    }
    let missed: usize = rows.iter().map(|r| r.missed).sum();
    let mut out = String::from("\n");
    out += &modelserve::cli::status::table(&main);
    out += "\nGoals: 10,000 all OnDemand < 10 min; RSS < 250 MiB; 0 reads and 0 writes per minute idle; p99 < 1 s.\n";
    out += "idle reads/writes: the operator's modelserve_kube_requests_total (n/a: it does not export it); reads are get and list.\n";
    out += "idle watch renewals: its watches (one per kind it caches, whatever the number of models) reopened when the API server ends them, every 290 s each.\n";
    if missed > 0 {
        out += &format!("{missed} change(s) not observed within 30 s count as slower than any.\n");
    }
    out += "\nCross-check, apiserver_request_total over the same window (every client's):\n";
    out += &modelserve::cli::status::table(&check);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ms: &[u64], missed: usize) -> Row {
        Row {
            models: 10,
            latencies: ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            missed,
            ..Row::default()
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_and_misses_count_as_slowest() {
        let r = row(&(1..=100).collect::<Vec<_>>(), 0);
        assert_eq!(latency(&r, 0.5), "50 ms");
        assert_eq!(latency(&r, 0.99), "99 ms");
        let r = row(&(1..=98).collect::<Vec<_>>(), 2);
        assert_eq!(latency(&r, 0.5), "50 ms");
        assert_eq!(latency(&r, 0.99), ">30 s");
        assert_eq!(latency(&row(&[], 0), 0.5), "-");
        assert_eq!(latency(&row(&[], 3), 0.5), ">30 s");
    }

    #[test]
    fn the_table_has_one_row_per_n() {
        let mut r = row(&[10, 20], 0);
        r.on_demand = OnDemand::After(Duration::from_secs(187));
        r.rss_peak = Some(200 << 20);
        r.rss_settled = Some(150 << 20);
        r.operator_idle = Some(Requests {
            reads: 0.0,
            watches: 0.0,
            writes: 0.0,
        });
        let mut t = row(&[], 0);
        t.on_demand = OnDemand::Partly {
            done: 900,
            by: Duration::from_secs(1200),
        };
        let text = table(&[r, t]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("models   all OnDemand after   RSS peak / settled"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("10       3m07s                200 MiB / 150 MiB    0.0"),
            "{text}"
        );
        assert!(lines[3].contains("900/10 by 20m00s"), "{text}");
        assert!(text.contains("modelserve.dev writes/min"), "{text}");
    }
}

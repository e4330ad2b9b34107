//! wrk as the load generator of the gateway benchmark: one Lua script per target (method, body,
//! headers), its `--latency` output read into a [`Run`], and the table of ratios.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// wrk on PATH, or how to get it.
pub fn check() -> Result<(), String> {
    match Command::new("wrk").arg("--version").output() {
        Ok(_) => Ok(()),
        Err(_) => Err("wrk is not installed: `apt-get install wrk` (Debian's package)".into()),
    }
}

/// One URL and the request wrk sends to it.
pub struct Target {
    pub name: &'static str,
    url: String,
    script: PathBuf,
}

impl Target {
    pub fn new(
        name: &'static str,
        url: &str,
        key: &str,
        body: &serde_json::Value,
        dir: &Path,
    ) -> Result<Target, String> {
        let script = dir.join(format!("{name}.lua"));
        // Lua long strings ([==[ ]==]) take the JSON and the key as they are.
        let lua = format!(
            "wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"Authorization\"] = [==[Bearer {key}]==]\n"
        );
        std::fs::write(&script, lua).map_err(|e| format!("{}: {e}", script.display()))?;
        Ok(Target {
            name,
            url: url.into(),
            script,
        })
    }

    /// wrk with `connections` for `time`; an error when any request failed.
    pub fn run(&self, connections: u32, time: Duration) -> Result<Run, String> {
        let threads = connections.min(2);
        let out = Command::new("wrk")
            .args(["-t", &threads.to_string(), "-c", &connections.to_string()])
            .args(["-d", &format!("{}s", time.as_secs().max(1)), "--latency"])
            // A request is a timeout only after 30 s (wrk's default is 2 s): on a busy machine
            // a slow answer is a latency to report, not a failed request.
            .args(["--timeout", "30s"])
            .arg("-s")
            .arg(&self.script)
            .arg(&self.url)
            .output()
            .map_err(|e| format!("cannot run wrk: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "wrk against {} failed: {text}{}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let run = parse(&text).ok_or_else(|| format!("cannot read wrk's output:\n{text}"))?;
        if run.errors > 0 {
            return Err(format!(
                "{}: {} requests failed:\n{text}",
                self.name, run.errors
            ));
        }
        Ok(run)
    }
}

/// What one wrk run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    pub requests: u64,
    pub per_second: f64,
    /// Seconds.
    pub p50: f64,
    pub p99: f64,
    /// Non-2xx answers and socket errors.
    pub errors: u64,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests, {:.1}/s, p50 {:.3} ms, p99 {:.3} ms",
            self.requests,
            self.per_second,
            self.p50 * 1e3,
            self.p99 * 1e3
        )
    }
}

impl Run {
    /// The median of each figure of several runs (of an even number, the mean of the middle
    /// two), and their requests and errors summed.
    pub fn median(runs: &[Run]) -> Run {
        let median = |f: fn(&Run) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            match v.len() {
                0 => 0.0,
                n if n % 2 == 1 => v[n / 2],
                n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
            }
        };
        Run {
            requests: runs.iter().map(|r| r.requests).sum(),
            per_second: median(|r| r.per_second),
            p50: median(|r| r.p50),
            p99: median(|r| r.p99),
            errors: runs.iter().map(|r| r.errors).sum(),
        }
    }
}

/// A wrk duration such as `635.91us`, `1.01ms` or `2.00s`, in seconds.
fn seconds(s: &str) -> Option<f64> {
    let (n, unit) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        return None;
    };
    n.parse::<f64>().ok().map(|v| v * unit)
}

/// Reads wrk's `--latency` report.
pub fn parse(text: &str) -> Option<Run> {
    let mut run = Run {
        requests: 0,
        per_second: 0.0,
        p50: 0.0,
        p99: 0.0,
        errors: 0,
    };
    let (mut p50, mut p99, mut rps, mut reqs) = (None, None, None, None);
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["50%", v] => p50 = seconds(v),
            ["99%", v] => p99 = seconds(v),
            ["Requests/sec:", v] => rps = v.parse().ok(),
            [n, "requests", "in", ..] => reqs = n.parse().ok(),
            ["Non-2xx", "or", "3xx", "responses:", n] => run.errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                run.errors += rest
                    .iter()
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    run.p50 = p50?;
    run.p99 = p99?;
    run.per_second = rps?;
    run.requests = reqs?;
    Some(run)
}

/// User and system CPU seconds of a process so far, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let (_, f) = super::cpus::stat_fields(&stat).ok_or("no ')' in stat")?;
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("short stat")
    };
    // utime and stime are fields 14 and 15 of stat, the 12th and 13th after the name.
    let total = ticks(11)? + ticks(12)?;
    // /proc counts in USER_HZ, 100 a second on Linux whatever the kernel's own tick.
    Ok(total as f64 / 100.0)
}

/// The table: per connection count, direct and gateway side by side, and the ratios.
pub fn report(
    rows: &[(u32, Run, Run)],
    gateway_requests: u64,
    cpu: f64,
    (peak, now): (u64, u64),
    took: Duration,
    placement: &str,
    args: &super::Args,
) -> String {
    let mut out = format!(
        "\ngateway-bench: chat completions of {} tokens, {} s per run, median of {} rounds (direct and gateway alternating), {:.0} s in all; {placement}\n\n",
        args.max_tokens,
        args.secs,
        args.rounds,
        took.as_secs_f64()
    );
    out.push_str(
        "connections   direct p50   gateway p50   overhead   direct req/s   gateway req/s   ratio\n",
    );
    for (c, d, g) in rows {
        out.push_str(&format!(
            "{c:>11}   {:>7.3} ms   {:>8.3} ms   {:>+6.3} ms   {:>12.1}   {:>13.1}   {:.3}x\n",
            d.p50 * 1e3,
            g.p50 * 1e3,
            (g.p50 - d.p50) * 1e3,
            d.per_second,
            g.per_second,
            g.per_second / d.per_second
        ));
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    out.push_str(&format!(
        "\ngateway: RSS {:.1} MiB (peak {:.1} MiB); CPU {:.1} ms per 1,000 requests ({gateway_requests} requests, {cpu:.2} s of CPU)\n",
        mib(now),
        mib(peak),
        cpu * 1e6 / gateway_requests.max(1) as f64
    ));
    if let (Some(one), Some(full)) = (rows.first(), rows.last()) {
        let overhead = (one.2.p50 - one.1.p50) * 1e3;
        let ratio = full.2.per_second / full.1.per_second;
        out.push_str(&format!(
            "goals: p50 overhead {overhead:.3} ms (<= 1 ms: {}); throughput {ratio:.3}x at {} concurrent requests (>= 0.95x: {})\n",
            if overhead <= 1.0 { "met" } else { "NOT met" },
            full.0,
            if ratio >= 0.95 { "met" } else { "NOT met" },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrks_latency_report_is_read() {
        let text = "Running 2s test @ http://127.0.0.1:1/v1/chat/completions
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.21ms    1.02ms  20.11ms   90.00%
  Latency Distribution
     50%  635.91us
     75%    5.50ms
     90%    6.10ms
     99%    1.20s
  12345 requests in 2.00s, 1.23MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   6172.50
Transfer/sec:    628.10KB
";
        let r = parse(text).unwrap();
        assert_eq!(r.requests, 12345);
        assert!((r.p50 - 635.91e-6).abs() < 1e-9);
        assert!((r.p99 - 1.2).abs() < 1e-9);
        assert_eq!(r.per_second, 6172.5);
        assert_eq!(r.errors, 3);
    }

    #[test]
    fn the_median_of_two_runs_is_their_mean_and_of_three_the_middle_one() {
        let run = |per_second: f64, p50: f64| Run {
            requests: 10,
            per_second,
            p50,
            p99: p50 * 2.0,
            errors: 0,
        };
        let two = Run::median(&[run(450.0, 0.07), run(440.0, 0.06)]);
        assert_eq!((two.per_second, two.requests), (445.0, 20));
        assert!((two.p50 - 0.065).abs() < 1e-12);
        let three = Run::median(&[run(1.0, 3.0), run(3.0, 1.0), run(2.0, 2.0)]);
        assert_eq!((three.per_second, three.p50), (2.0, 2.0));
    }
}

//! Request counters from Prometheus text: the operator's `modelserve_kube_requests_total` and the
//! API server's `apiserver_request_total`, split by their verb label into reads (get, list),
//! watch requests (a watch is held open and renewed when it times out, however many objects it
//! carries) and writes.

/// Requests counted so far, split by what they do.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Requests {
    pub reads: f64,
    pub watches: f64,
    pub writes: f64,
}

impl Requests {
    /// Per minute between `self` (earlier) and `later`, over `secs` seconds.
    pub fn per_minute(&self, later: &Requests, secs: f64) -> Requests {
        let rate = |a: f64, b: f64| (b - a).max(0.0) * 60.0 / secs.max(1e-9);
        Requests {
            reads: rate(self.reads, later.reads),
            watches: rate(self.watches, later.watches),
            writes: rate(self.writes, later.writes),
        }
    }
}

/// A verb that reads once: get, list (any case, as both the API server and a client layer may
/// spell it).
fn is_read(verb: &str) -> bool {
    ["get", "list", "head"]
        .iter()
        .any(|v| verb.eq_ignore_ascii_case(v))
}

/// A verb that opens a watch.
fn is_watch(verb: &str) -> bool {
    ["watch", "watchlist"]
        .iter()
        .any(|v| verb.eq_ignore_ascii_case(v))
}

/// One sample line: metric name, labels, value.
#[derive(Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a Prometheus text exposition; lines it cannot read are skipped.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter_map(sample).collect()
}

fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line.get(..name_end)?.to_string();
    let rest = line.get(name_end..)?;
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (Vec::new(), rest),
    };
    // The value, then perhaps a timestamp.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `key="value",...}` and what follows the closing brace.
fn labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let eq = s.find('=')?;
        let key = s.get(..eq)?.trim().to_string();
        let mut chars = s.get(eq + 1..)?.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let after = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i + 1,
                c => value.push(c),
            }
        };
        s = s.get(eq + 1..)?.get(1..)?.get(after..)?;
        out.push((key, value));
    }
}

/// The reads and writes counted by `metric`, over the samples `keep` accepts.
pub fn requests(all: &[Sample], metric: &str, keep: impl Fn(&Sample) -> bool) -> Option<Requests> {
    let mut found = false;
    let mut r = Requests::default();
    for s in all.iter().filter(|s| s.name == metric && keep(s)) {
        found = true;
        let verb = s.label("verb").unwrap_or_default();
        if is_read(verb) {
            r.reads += s.value;
        } else if is_watch(verb) {
            r.watches += s.value;
        } else {
            r.writes += s.value;
        }
    }
    found.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const APISERVER: &str = r#"
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="modelserve.dev",resource="modelserves",scope="namespace",subresource="status",verb="APPLY",version="v1alpha1"} 12
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 30
apiserver_request_total{code="0",component="apiserver",dry_run="",group="modelserve.dev",resource="modelserves",scope="namespace",subresource="",verb="WATCH",version="v1alpha1"} 3
apiserver_request_total{code="201",component="apiserver",group="",resource="events",verb="POST",version="v1"} 5 1700000000000
apiserver_request_duration_seconds_bucket{le="0.1",verb="GET"} 99
"#;

    #[test]
    fn reads_and_writes_are_told_apart_by_verb() {
        let s = samples(APISERVER);
        assert_eq!(s.len(), 5);
        let all = requests(&s, "apiserver_request_total", |_| true).unwrap();
        assert_eq!(
            all,
            Requests {
                reads: 30.0,
                watches: 3.0,
                writes: 17.0
            }
        );
        let ours = requests(&s, "apiserver_request_total", |s| {
            s.label("group") == Some("modelserve.dev")
        })
        .unwrap();
        assert_eq!(
            ours,
            Requests {
                reads: 0.0,
                watches: 3.0,
                writes: 12.0
            }
        );
        assert_eq!(
            requests(&s, "modelserve_kube_requests_total", |_| true),
            None
        );
    }

    #[test]
    fn the_operators_counter_reads_with_lowercase_verbs() {
        let text = "modelserve_kube_requests_total{verb=\"get\",kind=\"ModelServe\"} 4\nmodelserve_kube_requests_total{verb=\"patch\",kind=\"ModelServe\"} 2\nmodelserve_kube_requests_total{verb=\"list\"} 1.0e1\n";
        let r = requests(&samples(text), "modelserve_kube_requests_total", |_| true).unwrap();
        assert_eq!(
            r,
            Requests {
                reads: 14.0,
                watches: 0.0,
                writes: 2.0
            }
        );
    }

    #[test]
    fn escaped_label_values_and_junk_lines_are_handled() {
        let s = samples("x{a=\"q\\\"uo,te}\",b=\"2\"} 7\nnot a sample\ny 3\nz{broken 1\n");
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].label("a"), Some("q\"uo,te}"));
        assert_eq!(s[0].label("b"), Some("2"));
        assert_eq!(s[1].value, 3.0);
    }

    #[test]
    fn a_rate_per_minute_never_goes_negative() {
        let a = Requests {
            reads: 10.0,
            watches: 7.0,
            writes: 5.0,
        };
        let b = Requests {
            reads: 40.0,
            watches: 14.0,
            writes: 2.0,
        };
        assert_eq!(
            a.per_minute(&b, 30.0),
            Requests {
                reads: 60.0,
                watches: 14.0,
                writes: 0.0
            }
        );
    }
}

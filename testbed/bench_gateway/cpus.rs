//! Where the benchmark's processes run. In a cluster the gateway runs in a pod of its own and the
//! model's replica on CPUs of its own (its Deployment's CPU request), so neither takes CPU time
//! from the other. On one machine they share the cores with the load generator, and whatever
//! CPU the gateway uses is taken from the engine: what the benchmark then measures is the
//! contention, not the gateway's throughput. So by default the engine's process is pinned to
//! half of the CPUs (at least one) and told to use that many threads, and the benchmark itself
//! (and so wrk and the gateway it starts) to the others, for the direct and the gateway runs
//! alike. `--share` runs everything on every CPU, the engine with its default threads.

use std::collections::HashMap;

/// The CPUs of each side.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub engine: Vec<usize>,
    pub rest: Vec<usize>,
}

impl Split {
    /// Half of `cpus` (the last ones, at least one) for the engine, the rest for everything
    /// else; None when there are fewer than two.
    pub fn of(cpus: &[usize]) -> Option<Split> {
        if cpus.len() < 2 {
            return None;
        }
        let engine = (cpus.len() / 2).max(1);
        let (rest, engine) = cpus.split_at(cpus.len() - engine);
        Some(Split {
            engine: engine.to_vec(),
            rest: rest.to_vec(),
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "the engine pinned to CPU {} ({} thread{}), wrk and the gateway to CPU {}",
            list(&self.engine),
            self.engine.len(),
            if self.engine.len() == 1 { "" } else { "s" },
            list(&self.rest)
        )
    }
}

fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs this process may run on.
pub fn available() -> Result<Vec<usize>, String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity writes at most its
    // size into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins every thread of process `pid` to `cpus`. Threads it starts later inherit the set of the
/// thread that starts them, and so do its children.
pub fn pin(pid: u32, cpus: &[usize]) -> Result<(), String> {
    // SAFETY: as above; CPU_SET is given indices below CPU_SETSIZE only.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let tasks = numbered(&format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list the threads of process {pid}: {e}"))?;
    for tid in tasks {
        let Ok(tid) = i32::try_from(tid) else {
            continue;
        };
        let rc =
            unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(format!(
                "cannot pin thread {tid} of process {pid} to CPU {}: {}",
                list(cpus),
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The processes under `root` (children, grandchildren, ...) whose command name is `comm`.
pub fn descendants_named(root: u32, comm: &str) -> Vec<u32> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let mut names: HashMap<u32, String> = HashMap::new();
    for pid in numbered("/proc").unwrap_or_default() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((ppid, name)) = parse_stat(&stat) {
            parent.insert(pid, ppid);
            names.insert(pid, name);
        }
    }
    let under = |mut p: u32| {
        // At most as many steps as there are processes: the chain ends at 0 or 1.
        for _ in 0..parent.len() {
            match parent.get(&p) {
                Some(&pp) if pp == root => return true,
                Some(&pp) if pp > 1 => p = pp,
                _ => return false,
            }
        }
        false
    };
    let mut found: Vec<u32> = names
        .iter()
        .filter(|(pid, name)| name.as_str() == comm && under(**pid))
        .map(|(pid, _)| *pid)
        .collect();
    found.sort_unstable();
    found
}

/// The entries of `dir` named by a number (the processes of /proc, the threads of a task/).
fn numbered(dir: &str) -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect())
}

/// The command name of a /proc/PID/stat line and its fields after the name (the state first).
/// The name may hold spaces and parentheses, so it ends at the last ')'.
pub fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    Some((head.split_once('(')?.1, rest.split_whitespace().collect()))
}

/// The parent PID and command name of a /proc/PID/stat line.
fn parse_stat(stat: &str) -> Option<(u32, String)> {
    let (name, fields) = stat_fields(stat)?;
    let ppid = fields.get(1)?.parse().ok()?;
    Some((ppid, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_the_cpus_go_to_the_engine_and_at_least_one_to_each_side() {
        assert_eq!(Split::of(&[0]), None);
        assert_eq!(
            Split::of(&[0, 1]),
            Some(Split {
                engine: vec![1],
                rest: vec![0]
            })
        );
        let s = Split::of(&[0, 1, 2, 3, 4]).unwrap();
        assert_eq!((s.engine, s.rest), (vec![3, 4], vec![0, 1, 2]));
    }

    #[test]
    fn a_stat_line_gives_the_parent_and_the_name_with_spaces() {
        let line = "4242 (llama server) S 17 4242 4242 0 -1 4194560 100 0 0 0";
        assert_eq!(parse_stat(line), Some((17, "llama server".into())));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_found_under_its_parent() {
        let me = std::process::id();
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        let (ppid, name) = parse_stat(&stat).unwrap();
        assert!(descendants_named(ppid, &name).contains(&me));
        assert!(!available().unwrap().is_empty());
    }
}

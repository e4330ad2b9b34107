use super::*;

fn progress(path: &str, state: State) -> Arc<Progress> {
    let p = Progress::new(FileRef {
        repo: "o/r".into(),
        commit: "a".repeat(40),
        path: path.into(),
        sha256: format!("{:0>64}", path.len()),
        size: 1,
    });
    p.set(state);
    Arc::new(p)
}

#[test]
fn pruning_forgets_present_files_and_old_failures_but_keeps_what_runs() {
    let mut jobs = Jobs::default();
    for (path, state) in [
        ("a", State::Present),
        ("bb", State::Failed),
        ("ccc", State::Downloading),
        ("dddd", State::Queued),
    ] {
        let p = progress(path, state);
        jobs.files.insert(key(&p.file), p.clone());
        jobs.by_sha.insert(p.file.sha256.clone(), p);
    }
    let recent = Policy::default();
    jobs.prune(&recent);
    assert_eq!(
        jobs.files.len(),
        3,
        "a recent failure still holds off a retry"
    );
    assert_eq!(jobs.live(), 2);
    let old = Policy {
        retry_failed_after: std::time::Duration::ZERO,
        ..Policy::default()
    };
    jobs.prune(&old);
    let mut left: Vec<_> = jobs.files.values().map(|p| p.file.path.clone()).collect();
    left.sort();
    assert_eq!(left, ["ccc", "dddd"]);
    assert_eq!(jobs.by_sha.len(), 2);
}

#[test]
fn content_is_busy_until_the_file_that_follows_its_download_is_linked() {
    let mut jobs = Jobs::default();
    // The leader has landed; the follower (same content, another name) links it next.
    let leader = progress("x", State::Present);
    let follower = Arc::new(Progress::new(FileRef {
        path: "y".into(),
        ..leader.file.clone()
    }));
    follower.set(State::Downloading);
    jobs.files.insert(key(&leader.file), leader.clone());
    jobs.files.insert(key(&follower.file), follower.clone());
    jobs.by_sha
        .insert(leader.file.sha256.clone(), leader.clone());
    assert!(jobs.busy().contains(&leader.file.sha256));
    follower.set(State::Present);
    assert!(jobs.busy().is_empty());
}

#[test]
fn an_abandoned_partial_download_goes_and_one_still_referenced_stays_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (live, dead) = ("1".repeat(64), "2".repeat(64));
    for sha in [&live, &dead] {
        std::fs::write(store.partial(sha), b"abc").unwrap();
        std::fs::write(store.partial(sha).with_extension("segments"), b"x").unwrap();
    }
    let space = SpaceArgs {
        grace: std::time::Duration::ZERO,
        request_pin: std::time::Duration::ZERO,
        ..SpaceArgs::default()
    };
    let registry = crate::hub::RegistryArgs {
        registry_endpoint: "http://127.0.0.1:9".into(),
        registry_ca_bundle: None,
    };
    let m = Mirror::build(store.clone(), registry, Policy::default(), space).unwrap();
    m.collect_once().unwrap();
    assert_eq!(
        store.partials().unwrap().len(),
        2,
        "nothing goes before the operator speaks"
    );
    m.tell_live([live.clone()].into());
    m.collect_once().unwrap();
    let left: Vec<String> = store
        .partials()
        .unwrap()
        .into_iter()
        .map(|b| b.sha256)
        .collect();
    assert_eq!(left, std::slice::from_ref(&live));
    assert!(!store.partial(&dead).with_extension("segments").exists());
    assert!(store.partial(&live).with_extension("segments").exists());
}

#[test]
fn a_token_quoted_back_by_the_registry_is_scrubbed() {
    let t = Secret::new("hf_abc");
    assert_eq!(
        scrub("403: bad Bearer hf_abc for hf_abc".into(), Some(&t)),
        "403: bad Bearer <redacted> for <redacted>"
    );
    assert_eq!(scrub("x".into(), Some(&Secret::new(""))), "x");
    assert_eq!(scrub("hf_abc".into(), None), "hf_abc");
}

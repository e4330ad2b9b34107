//! The registry client against the fake Hub: every error cause, retries, pagination, the token,
//! and the bounds that keep a misbehaving registry from holding a reconcile or its memory.

mod support;

use std::time::{Duration, Instant};

use modelserve::hub::select::{Want, select};
use modelserve::hub::{Hub, HubError, Limits, MAX_REDIRECTS, Retry};
use modelserve::secret::Secret;
use support::fake_hub::{FAULT_COMMIT, FakeHub, HubFile, RepoFault};

fn quick() -> Retry {
    Retry {
        attempts: 3,
        base: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
        max_rate_limit_wait: Duration::from_secs(3),
        request_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        deadline: Duration::from_secs(20),
    }
}

fn hub(fake: &FakeHub, token: Option<&str>) -> Hub {
    Hub::new(&fake.url, token.map(Secret::new))
        .unwrap()
        .with_retry(quick())
        .unwrap()
}

async fn gguf_repo(fake: &FakeHub, repo: &str) -> String {
    fake.add_repo(
        repo,
        vec![
            HubFile::with_bytes("m-Q8_0.gguf", b"GGUF-bytes-of-the-model".to_vec()),
            HubFile::git("README.md", "hi\n"),
        ],
    )
}

#[tokio::test]
async fn model_info_pins_the_commit_and_the_tree_carries_sha256_and_size() {
    let fake = FakeHub::start().await;
    let commit = fake.add_listing("Qwen/Qwen2.5-7B-Instruct-GGUF");
    fake.set_page_size(4);
    let h = hub(&fake, None);
    let info = h
        .model_info("Qwen/Qwen2.5-7B-Instruct-GGUF", "main")
        .await
        .unwrap();
    assert_eq!(info.commit, commit);
    assert_eq!(info.gated, None);
    let files = h
        .tree("Qwen/Qwen2.5-7B-Instruct-GGUF", &info.commit)
        .await
        .unwrap();
    assert_eq!(files.len(), 19, "all pages are followed (page size 4)");
    assert!(fake.count("/tree/") >= 5);
    let f = files
        .iter()
        .find(|f| f.path == "qwen2.5-7b-instruct-q2_k.gguf")
        .unwrap();
    assert_eq!(f.size, 3_015_940_000);
    assert_eq!(f.sha256.as_ref().map(String::len), Some(64));
}

#[tokio::test]
async fn a_missing_repo_is_repo_not_found_with_and_without_token() {
    let fake = FakeHub::start().await;
    fake.add_token("hf_good", &[]);
    for token in [None, Some("hf_good")] {
        let e = hub(&fake, token)
            .model_info("nobody/nothing", "main")
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "RepoNotFound", "{e}");
        assert!(e.to_string().contains("nobody/nothing"), "{e}");
    }
}

#[tokio::test]
async fn a_private_repo_without_access_reads_as_not_found_and_with_access_works() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "acme/secret-GGUF").await;
    fake.set_private("acme/secret-GGUF");
    fake.add_token("hf_member", &["acme/secret-GGUF"]);
    let e = hub(&fake, None)
        .model_info("acme/secret-GGUF", "main")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("or it is private"), "{e}");
    assert!(
        hub(&fake, Some("hf_member"))
            .model_info("acme/secret-GGUF", "main")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_missing_revision_is_revision_not_found() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    let e = hub(&fake, None).model_info("o/r", "v9").await.unwrap_err();
    assert_eq!(
        e,
        HubError::RevisionNotFound {
            repo: "o/r".into(),
            revision: "v9".into()
        }
    );
    assert!(e.to_string().contains("check spec.revision"));
}

#[tokio::test]
async fn gated_repos_name_the_gate() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "meta/gated").await;
    fake.set_gated("meta/gated", "manual");
    fake.add_token("hf_waiting", &[]);
    fake.add_token("hf_approved", &["meta/gated"]);
    let info = hub(&fake, None)
        .model_info("meta/gated", "main")
        .await
        .unwrap();
    assert_eq!(
        info.gated.as_deref(),
        Some("manual"),
        "model info is public for gated repos"
    );

    let e = hub(&fake, None)
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "GatedRepoNoToken");
    assert!(e.to_string().contains("set spec.tokenSecretRef"), "{e}");
    let e = hub(&fake, Some("hf_waiting"))
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "GatedRepoNotApproved");
    assert!(
        e.to_string()
            .contains(&format!("ask for access at {}/meta/gated", fake.url)),
        "{e}"
    );
    hub(&fake, Some("hf_approved"))
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_disabled_repo_and_a_bad_token_have_their_own_reasons() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/off").await;
    fake.set_disabled("o/off");
    assert_eq!(
        hub(&fake, None)
            .model_info("o/off", "main")
            .await
            .unwrap_err()
            .reason(),
        "RepoDisabled"
    );
    gguf_repo(&fake, "o/on").await;
    let e = hub(&fake, Some("hf_wrong"))
        .model_info("o/on", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "InvalidToken");
    assert!(e.to_string().contains("check the Secret"), "{e}");
}

#[tokio::test]
async fn rate_limits_are_waited_out_after_the_advertised_reset() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail(
        "/revision/",
        429,
        &[
            ("ratelimit", "\"api\";r=0;t=1"),
            ("ratelimit-policy", "\"fixed window\";\"api\";q=500;w=300"),
        ],
        1,
    );
    let started = Instant::now();
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the retry came before the advertised reset"
    );
    assert_eq!(fake.count("/revision/"), 2);
}

#[tokio::test]
async fn a_long_rate_limit_is_returned_as_transient_with_its_reset() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail("/revision/", 429, &[("retry-after", "120")], 1);
    let e = hub(&fake, None)
        .model_info("o/r", "main")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HubError::RateLimited {
            retry_after: Duration::from_secs(120)
        }
    );
    assert!(e.is_transient());
    assert_eq!(fake.count("/revision/"), 1, "no request before the reset");
}

#[tokio::test]
async fn server_errors_are_retried_then_reported_as_unavailable() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail("/revision/", 503, &[], 2);
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
    fake.fail("/revision/", 502, &[], 3);
    let e = hub(&fake, None)
        .model_info("o/r", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryUnavailable");
    assert!(e.is_transient());
    assert!(
        e.to_string().contains("HTTP 502") && e.to_string().contains("after 3 attempts"),
        "{e}"
    );
    fake.fail("/revision/", 408, &[], 1);
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
}

#[tokio::test]
async fn a_slow_registry_times_out_and_is_retried() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.slow("/revision/", Duration::from_secs(3), 1);
    let mut r = quick();
    r.request_timeout = Duration::from_millis(500);
    let h = Hub::new(&fake.url, None).unwrap().with_retry(r).unwrap();
    h.model_info("o/r", "main").await.unwrap();
    fake.slow("/revision/", Duration::from_secs(3), 5);
    let e = h.model_info("o/r", "main").await.unwrap_err();
    assert_eq!(e.reason(), "RegistryNotAnswering", "{e}");
    assert!(e.to_string().contains("timed out"), "{e}");
}

#[tokio::test]
async fn the_token_never_reaches_the_cdn_host() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "o/r").await;
    fake.add_token("hf_secret", &["o/r"]);
    let h = hub(&fake, Some("hf_secret"));
    let bytes = h
        .read_range("o/r", &commit, "m-Q8_0.gguf", 0, 4)
        .await
        .unwrap();
    assert_eq!(bytes, b"GGUF");
    let bytes = h
        .read_range("o/r", &commit, "m-Q8_0.gguf", 5, 5)
        .await
        .unwrap();
    assert_eq!(bytes, b"bytes");
    assert!(
        fake.cdn_authorizations().is_empty(),
        "the CDN saw: {:?}",
        fake.cdn_authorizations()
    );
}

#[tokio::test]
async fn a_missing_file_is_file_not_found() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "o/r").await;
    let e = hub(&fake, None)
        .read_range("o/r", &commit, "nope.gguf", 0, 4)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "FileNotFound");
}

#[tokio::test]
async fn malformed_input_never_reaches_the_network() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    for (repo, rev) in [
        ("../etc", "main"),
        ("a/b", "../../x"),
        ("a/b?x", "main"),
        ("a/b", "x y"),
    ] {
        let e = h.model_info(repo, rev).await.unwrap_err();
        assert_eq!(e.reason(), "InvalidSpec", "{repo} {rev}: {e}");
    }
    assert!(fake.requests().is_empty());
}

/// Settings under which a registry that does not answer fails in about a second.
fn impatient() -> Retry {
    Retry {
        read_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_secs(1),
        deadline: Duration::from_secs(3),
        ..quick()
    }
}

fn patient_for(fake: &FakeHub, retry: Retry) -> Hub {
    Hub::new(&fake.url, None)
        .unwrap()
        .with_retry(retry)
        .unwrap()
}

#[tokio::test]
async fn a_registry_that_never_answers_fails_each_call_within_its_deadline() {
    let fake = FakeHub::start().await;
    let h = patient_for(&fake, impatient());
    let repo = "faults/never-answers";
    let started = Instant::now();
    let e = h.model_info(repo, "main").await.unwrap_err();
    let took = started.elapsed();
    match &e {
        HubError::NoAnswer {
            endpoint, attempts, ..
        } => {
            assert_eq!(*attempts, 3, "{e}");
            assert_eq!(endpoint, &format!("{}/", fake.url));
        }
        other => panic!("not NoAnswer: {other:?}"),
    }
    assert!(e.is_transient());
    assert!(
        e.to_string()
            .contains("did not answer the model info of faults/never-answers"),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(900),
        "three read timeouts: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(fake.count("faults/never-answers"), 3);

    // Every call is bounded the same way, whatever it asks.
    let started = Instant::now();
    let tree = h.tree(repo, FAULT_COMMIT).await.unwrap_err();
    let access = h
        .check_access(repo, FAULT_COMMIT, "m.gguf")
        .await
        .unwrap_err();
    let range = h
        .read_range(repo, FAULT_COMMIT, "m.gguf", 0, 4)
        .await
        .unwrap_err();
    let download = h
        .download(repo, FAULT_COMMIT, "m.gguf", 0..4)
        .await
        .unwrap_err();
    for e in [tree, access, range, download] {
        assert_eq!(e.reason(), "RegistryNotAnswering", "{e}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_deadline_bounds_a_call_whose_timeouts_are_long() {
    let fake = FakeHub::start().await;
    let h = patient_for(
        &fake,
        Retry {
            read_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
            deadline: Duration::from_millis(700),
            ..quick()
        },
    );
    let started = Instant::now();
    let e = h
        .model_info("faults/never-answers-2", "main")
        .await
        .unwrap_err();
    assert!(matches!(e, HubError::NoAnswer { attempts: 1, .. }), "{e:?}");
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(650)..Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_body_that_stops_midway_fails_on_the_read_timeout() {
    let fake = FakeHub::start().await;
    let h = patient_for(&fake, impatient());
    let started = Instant::now();
    let e = h
        .model_info("faults/stalls-body", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryNotAnswering", "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let e = h
        .tree("faults/stalls-body", FAULT_COMMIT)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryNotAnswering", "{e}");
}

#[tokio::test]
async fn malformed_json_names_the_endpoint_and_what_was_expected() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    let e = h
        .model_info("faults/malformed-json", "main")
        .await
        .unwrap_err();
    let HubError::MalformedJson {
        endpoint,
        what,
        expected,
        begins,
        ..
    } = &e
    else {
        panic!("not MalformedJson: {e:?}");
    };
    assert_eq!(endpoint, &format!("{}/", fake.url));
    assert_eq!(what, "the model info of faults/malformed-json at main");
    assert!(expected.contains("\"sha\""), "{expected}");
    assert!(begins.starts_with("<!DOCTYPE html>"), "{begins}");
    assert_eq!(e.reason(), "MalformedRegistryJson");
    assert!(e.is_transient(), "a broken proxy heals");
    assert!(e.to_string().contains(&fake.url), "{e}");
    assert_eq!(
        fake.count("faults/malformed-json"),
        1,
        "not retried within the call"
    );

    let e = h
        .tree("faults/malformed-json", FAULT_COMMIT)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "MalformedRegistryJson");
    assert!(e.to_string().contains("page 1 of the file tree"), "{e}");
    assert!(e.to_string().contains("an array of entries"), "{e}");

    // The same fault chosen by a fixture's listing entry, and on an ordinary repository.
    let repo = "modelserve-test/behind-a-broken-proxy-GGUF";
    fake.add_listing(repo);
    let e = h.model_info(repo, "main").await.unwrap_err();
    assert_eq!(e.reason(), "MalformedRegistryJson", "{e}");
    gguf_repo(&fake, "o/r").await;
    fake.set_fault("o/r", Some(RepoFault::MalformedJson));
    assert_eq!(
        h.model_info("o/r", "main").await.unwrap_err().reason(),
        "MalformedRegistryJson"
    );
    fake.set_fault("o/r", None);
    h.model_info("o/r", "main").await.unwrap();
}

#[tokio::test]
async fn an_answer_past_its_cap_stops_being_read_and_names_the_cap() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    let e = h
        .model_info("faults/huge-answer", "main")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HubError::TooLarge {
            endpoint: format!("{}/", fake.url),
            what: "the model info of faults/huge-answer at main".into(),
            cap: 16 << 20,
        }
    );
    assert!(e.to_string().contains("more than 16.0 MiB"), "{e}");
    assert_eq!(e.reason(), "RegistryResponseTooLarge");
    assert!(!e.is_transient());
    let small = h.clone().with_limits(Limits {
        page_bytes: 1 << 20,
        ..Limits::default()
    });
    let e = small
        .tree("faults/huge-answer", FAULT_COMMIT)
        .await
        .unwrap_err();
    assert!(
        matches!(e, HubError::TooLarge { cap: 0x10_0000, .. }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("more than 1.0 MiB for page 1 of the file tree"),
        "{e}"
    );
}

#[tokio::test]
async fn an_endless_tree_stops_at_the_file_bound() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    let started = Instant::now();
    let e = h
        .tree("faults/endless-tree", FAULT_COMMIT)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HubError::TooManyFiles {
            repo: "faults/endless-tree".into(),
            max: 200_000
        }
    );
    assert!(!e.is_transient());
    // 1000 files a page: the 200 001st file, on page 201, is one too many.
    assert_eq!(fake.count("faults/endless-tree"), 201);
    println!(
        "200 000 files listed and refused in {:?}",
        started.elapsed()
    );

    let few_pages = h.clone().with_limits(Limits {
        tree_pages: 3,
        ..Limits::default()
    });
    let e = few_pages
        .tree("faults/endless-tree-2", FAULT_COMMIT)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HubError::TooManyPages {
            repo: "faults/endless-tree-2".into(),
            max: 3,
            files: 3000
        }
    );
    assert_eq!(e.reason(), "TooManyTreePages");
}

#[tokio::test]
async fn a_redirect_loop_stops_at_the_redirect_bound() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    let e = h
        .model_info("faults/redirect-loop", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "TooManyRedirects", "{e}");
    assert!(
        e.to_string()
            .contains(&format!("more than {MAX_REDIRECTS} times")),
        "{e}"
    );
    assert_eq!(
        fake.count("faults/redirect-loop"),
        MAX_REDIRECTS + 1,
        "not retried"
    );
    let e = h
        .read_range("faults/redirect-loop", FAULT_COMMIT, "m.gguf", 0, 4)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "TooManyRedirects", "{e}");
}

#[tokio::test]
async fn an_error_answer_is_quoted_from_its_first_bytes_only() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail_endless("/revision/", 403, 1);
    let started = Instant::now();
    let e = hub(&fake, None)
        .model_info("o/r", "main")
        .await
        .unwrap_err();
    let HubError::Forbidden {
        status, message, ..
    } = &e
    else {
        panic!("not Forbidden: {e:?}");
    };
    assert_eq!(*status, 403);
    assert_eq!(message, &format!("{} [cut]", "x".repeat(300)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "an endless body is not read"
    );
}

#[tokio::test]
async fn a_non_ascii_listing_is_listed_chosen_and_read_through_encoded_urls() {
    let fake = FakeHub::start().await;
    let repo = "modelserve-test/unicode-names-GGUF";
    let commit = fake.add_listing(repo);
    fake.set_page_size(3);
    let h = hub(&fake, None);
    let files = h.tree(repo, &commit).await.unwrap();
    assert_eq!(files.len(), 11, "all pages of a paginated listing");
    assert!(files.iter().any(|f| f.path == "xéééééééé.gguf"));
    let set = select(repo, &files, Want::Quant("Q4_K_M")).unwrap();
    let paths: Vec<&str> = set.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "Модели/Модель-Q4_K_M-00001-of-00003.gguf",
            "Модели/Модель-Q4_K_M-00002-of-00003.gguf",
            "Модели/Модель-Q4_K_M-00003-of-00003.gguf"
        ]
    );
    for f in &set.files {
        let magic = h.read_range(repo, &commit, &f.path, 0, 4).await.unwrap();
        assert_eq!(magic, b"GGUF", "{}", f.path);
    }
    h.check_access(repo, &commit, "e\u{301}te\u{301}-Q6_K.gguf")
        .await
        .unwrap();
}

mod tls {
    //! A registry behind TLS whose certificate chains to a private CA: refused with the
    //! built-in roots, trusted with `--registry-ca-bundle`.

    use std::sync::Arc;

    use axum::Router;
    use axum::routing::get;
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::{ServerConfig, crypto::ring};

    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name)
    }

    struct TlsListener {
        tcp: tokio::net::TcpListener,
        tls: TlsAcceptor,
    }

    impl axum::serve::Listener for TlsListener {
        type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
        type Addr = std::net::SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let Ok((tcp, addr)) = self.tcp.accept().await else {
                    continue;
                };
                // A client that refuses the certificate ends its handshake; wait for the next.
                if let Ok(tls) = self.tls.accept(tcp).await {
                    return (tls, addr);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.tcp.local_addr()
        }
    }

    /// An HTTPS registry on loopback answering model info for any repository.
    async fn start() -> String {
        let certs = CertificateDer::pem_file_iter(fixture("server.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
        let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://127.0.0.1:{}", tcp.local_addr().unwrap().port());
        let app = Router::new().route(
            "/api/models/{owner}/{name}/revision/{rev}",
            get(|| async { format!("{{\"sha\":\"{}\"}}", "c".repeat(40)) }),
        );
        let listener = TlsListener {
            tcp,
            tls: TlsAcceptor::from(Arc::new(config)),
        };
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    #[tokio::test]
    async fn a_private_ca_is_trusted_only_with_the_ca_bundle() {
        let url = start().await;
        let built_in = Hub::new(&url, None).unwrap().with_retry(quick()).unwrap();
        let e = built_in.model_info("o/r", "main").await.unwrap_err();
        assert_eq!(e.reason(), "RegistryUnavailable", "{e}");
        let with_ca = Hub::new(&url, None)
            .unwrap()
            .with_ca_bundle(Some(&fixture("ca.pem")))
            .unwrap()
            .with_retry(quick())
            .unwrap();
        let info = with_ca.model_info("o/r", "main").await.unwrap();
        assert_eq!(info.commit, "c".repeat(40));
        let args = modelserve::hub::RegistryArgs {
            registry_endpoint: url.clone(),
            registry_ca_bundle: Some(fixture("ca.pem")),
        };
        args.hub(None)
            .unwrap()
            .model_info("o/r", "main")
            .await
            .unwrap();
        let e = modelserve::hub::RegistryArgs {
            registry_ca_bundle: Some(fixture("README.md")),
            ..args
        }
        .hub(None)
        .unwrap_err();
        assert_eq!(e.reason(), "InvalidCaBundle", "{e}");
    }
}

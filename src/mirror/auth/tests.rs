//! The checker against an API server of our own on loopback that answers TokenReviews slowly.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;

use super::*;

/// What the fake API server saw: reviews in flight now, the most at once, and all of them.
#[derive(Default)]
struct Seen {
    now: AtomicUsize,
    most: AtomicUsize,
    all: AtomicUsize,
}

/// An API server whose TokenReviews take `hold` and refuse every token; everything else is 404.
async fn slow_api_server(seen: Arc<Seen>, hold: Duration) -> String {
    let app = Router::new().route(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        post(async move || {
            let n = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most.fetch_max(n, Ordering::SeqCst);
            seen.all.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            seen.now.fetch_sub(1, Ordering::SeqCst);
            Json(serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {}, "status": {"authenticated": false, "error": "token is not valid"},
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn with_token(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_tokens_sends_at_most_the_bounded_number_of_reviews_at_once() {
    let seen = Arc::new(Seen::default());
    let url = slow_api_server(seen.clone(), Duration::from_millis(150)).await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let checker = Checker::start(
        client,
        DEFAULT_AUDIENCE.into(),
        vec![("ms".into(), "operator".into())],
    );
    let asks = (0..MOST_REVIEWS * 4).map(|i| {
        let c = checker.clone();
        tokio::spawn(async move { c.caller(&with_token(&format!("token-{i}"))).await })
    });
    let answers = futures::future::join_all(asks).await;
    for a in answers {
        let refusal = a.unwrap().unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNAUTHORIZED, "{refusal:?}");
        assert!(
            refusal.message.contains("token is not valid"),
            "{refusal:?}"
        );
    }
    assert_eq!(seen.all.load(Ordering::SeqCst), MOST_REVIEWS * 4);
    let most = seen.most.load(Ordering::SeqCst);
    assert!(
        (1..=MOST_REVIEWS).contains(&most),
        "{most} TokenReviews in flight at once; at most {MOST_REVIEWS} allowed"
    );
    // A refused token is remembered: asking again sends no review.
    let again = checker.caller(&with_token("token-0")).await.unwrap_err();
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
    assert_eq!(seen.all.load(Ordering::SeqCst), MOST_REVIEWS * 4);
}

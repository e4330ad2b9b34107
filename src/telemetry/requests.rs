//! A layer on the operator's Kubernetes client that counts every request it sends, by verb and
//! resource, so "an idle model costs no request" is a number on /metrics and not a belief.

use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The labels of one counted request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    /// get, list, watch, create, apply, patch, update, delete.
    pub verb: String,
    /// The resource's plural (`deployments`), with `/status` or another subresource appended.
    pub resource: String,
}

/// The counters, shared by the layer and the metrics registry.
pub type Requests = Family<RequestLabel, Counter>;

/// The tower layer that counts.
#[derive(Clone)]
pub struct CountLayer(pub Requests);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            requests: self.0.clone(),
        }
    }
}

/// A client service that counts what passes through it.
#[derive(Clone)]
pub struct Count<S> {
    inner: S,
    requests: Requests,
}

impl<S, B> tower::Service<http::Request<B>> for Count<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.requests.get_or_create(&label(&req)).inc();
        self.inner.call(req)
    }
}

/// The verb and resource of a request to the API server, read from its method and path.
pub fn label<B>(req: &http::Request<B>) -> RequestLabel {
    let uri = req.uri();
    let query = uri.query().unwrap_or("");
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let content = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (resource, named) = resource(uri.path());
    let verb = match *req.method() {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH if content.starts_with("application/apply-patch") => "apply",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    RequestLabel {
        verb: verb.into(),
        resource,
    }
}

/// `/api/v1/namespaces/ns/pods/name/status` -> ("pods/status", true): the resource (and
/// subresource) and whether the path names one object.
fn resource(path: &str) -> (String, bool) {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // /api/v1/... or /apis/group/version/...
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..),
        Some(&"apis") => parts.get(3..),
        _ => None,
    };
    let Some(mut rest) = rest else {
        return (path.chars().take(64).collect(), false);
    };
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        rest = rest.get(2..).unwrap_or_default();
    }
    match rest {
        [] => ("discovery".into(), false),
        [kind] => ((*kind).into(), false),
        [kind, _name] => ((*kind).into(), true),
        [kind, _name, sub, ..] => (format!("{kind}/{sub}"), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str, content: &str) -> RequestLabel {
        let r = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content)
            .body(())
            .unwrap();
        label(&r)
    }

    fn l(verb: &str, resource: &str) -> RequestLabel {
        RequestLabel {
            verb: verb.into(),
            resource: resource.into(),
        }
    }

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        assert_eq!(
            req("GET", "/apis/apps/v1/namespaces/a/deployments/m", ""),
            l("get", "deployments")
        );
        assert_eq!(
            req(
                "GET",
                "/apis/apps/v1/deployments?labelSelector=x&watch=true&timeoutSeconds=290",
                ""
            ),
            l("watch", "deployments")
        );
        assert_eq!(req("GET", "/api/v1/nodes", ""), l("list", "nodes"));
        assert_eq!(
            req(
                "PATCH",
                "/apis/modelserve.dev/v1alpha1/namespaces/a/modelserves/m/status?fieldManager=x",
                "application/apply-patch+yaml"
            ),
            l("apply", "modelserves/status")
        );
        assert_eq!(
            req("POST", "/api/v1/namespaces/a/secrets", "application/json"),
            l("create", "secrets")
        );
        assert_eq!(
            req(
                "PATCH",
                "/apis/events.k8s.io/v1/namespaces/a/events/e",
                "application/merge-patch+json"
            ),
            l("patch", "events")
        );
        assert_eq!(req("GET", "/version", "").verb, "list");
    }

    #[test]
    fn the_layer_counts_each_request_once() {
        use tower::{Layer, Service};
        let family = Requests::default();
        let mut svc =
            CountLayer(family.clone()).layer(tower::service_fn(|_r: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(())
            }));
        let r = || http::Request::get("/api/v1/nodes").body(()).unwrap();
        futures::executor::block_on(async {
            let _ = svc.call(r()).await;
            let _ = svc.call(r()).await;
        });
        assert_eq!(family.get_or_create(&l("list", "nodes")).get(), 2);
    }
}

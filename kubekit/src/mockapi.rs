//! A scripted Kubernetes API server for reconcile tests (kube-rs controller-rs style): the
//! controller's client talks to a `tower-test` mock; each test states the exact requests it
//! expects, in order, answers them, and checks that no further request comes.
//!
//! Every request is also checked against the RBAC the bundle grants the component under test
//! (`deploy::rbac`, chosen by the source file that made the pair): a call its generated role
//! does not allow fails the test, so the roles cannot fall behind the code.

use std::time::Duration;

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How long to wait for a request that must come.
const EXPECT: Duration = Duration::from_secs(5);
/// How long to wait to be sure no further request comes.
const SILENCE: Duration = Duration::from_millis(300);

/// The server side of a mocked client.
pub struct ApiServer {
    handle: Handle,
    /// What the component under test may do.
    access: api::rbac::Access,
}

/// The component whose code lives in `file` (a test's source file).
fn component_of(file: &str) -> &'static str {
    use api::names::component;
    let dirs = [
        ("/datavolume/", component::DATAVOLUME_CONTROLLER),
        ("/hyperconverged/", component::HYPERCONVERGED_CONTROLLER),
        ("/hostpath/", component::HOSTPATH_CONTROLLER),
        ("/apiserver/", component::APISERVER),
        ("/certs/", component::CERT_CONTROLLER),
        // CDIConfig and StorageProfiles are kept by the DataVolume controller's process.
        ("/cdiconfig/", component::DATAVOLUME_CONTROLLER),
        ("/golden/", component::DATAVOLUME_CONTROLLER),
    ];
    dirs.iter()
        .find(|(dir, _)| file.contains(dir))
        .map(|(_, c)| *c)
        .unwrap_or_else(|| {
            panic!("mockapi::pair() called from {file}: add its component to mockapi::component_of")
        })
}

/// A client and the server that answers it, for the component whose source file calls this.
#[track_caller]
pub fn pair() -> (Client, ApiServer) {
    let component = component_of(std::panic::Location::caller().file());
    let access = api::rbac::of(component).expect("every component has RBAC");
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (
        Client::new(service, "default"),
        ApiServer { handle, access },
    )
}

/// A Kubernetes `Status` error body.
pub fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": reason})
}

type Respond = tower_test::mock::SendResponse<Response<Body>>;

fn respond(send: Respond, code: u16, body: &Value) {
    let resp = Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    send.send_response(resp);
}

impl ApiServer {
    /// Waits for the next request and checks its method and path (query ignored); returns its
    /// query, JSON body (Null when empty) and the responder.
    async fn next(&mut self, method: Method, path: &str) -> (String, Value, Respond) {
        let (req, send) = tokio::time::timeout(EXPECT, self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {method} {path}"))
            .unwrap_or_else(|| panic!("client dropped before {method} {path}"));
        assert_eq!(
            format!("{} {}", req.method(), req.uri().path()),
            format!("{method} {path}"),
            "unexpected request"
        );
        let query = req.uri().query().unwrap_or_default().to_string();
        if let Some(r) = api::rbac::request(req.method(), req.uri().path(), &query) {
            assert!(
                api::rbac::allows(&self.access, &r, None),
                "{}'s generated RBAC does not grant {r}",
                self.access.component
            );
        }
        let bytes = req.into_body().collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        (query, body, send)
    }

    /// Answers the next request (which must be `method path`) with `code` and `body`; returns
    /// the request's query and JSON body.
    pub async fn expect(
        &mut self,
        method: Method,
        path: &str,
        code: u16,
        body: Value,
    ) -> (String, Value) {
        self.expect_with(method, path, code, |_| body).await
    }

    /// Like [`ApiServer::expect`], answering with `answer(request body)`.
    pub async fn expect_with(
        &mut self,
        method: Method,
        path: &str,
        code: u16,
        answer: impl FnOnce(&Value) -> Value,
    ) -> (String, Value) {
        let (query, sent, send) = self.next(method, path).await;
        respond(send, code, &answer(&sent));
        (query, sent)
    }

    /// Answers with the request body itself (a create or an apply that the server accepts).
    pub async fn expect_echo(&mut self, method: Method, path: &str) -> (String, Value) {
        let code = if method == Method::POST { 201 } else { 200 };
        self.expect_with(method, path, code, Value::clone).await
    }

    /// Answers the next request with 404.
    pub async fn not_found(&mut self, method: Method, path: &str) {
        self.expect(method, path, 404, status(404, "NotFound"))
            .await;
    }

    /// Fails if any request comes within a short while.
    pub async fn silence(&mut self) {
        if let Ok(Some((req, _))) = tokio::time::timeout(SILENCE, self.handle.next_request()).await
        {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }
}

//! The HTTP server: OpenAI-compatible routes over the scheduler, with API
//! keys, CORS, a body limit, Server-Sent Events and a graceful shutdown.
//!
//! The listener is bound before the model loads: `/health` answers 503
//! `{"status":"loading"}` until the loader hands over a [`LoadedModel`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fathom_engine::{ChatTemplate, Tokenizer};
use fathom_tokenizer::{encode_chat_tools, ChatEncodeError, Special, TooManyTokens};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::api::{self, ApiError, GenerationRequest, OutputConstraint, Prompt, Route};
use crate::constraint::{ConstraintState, Constraints, Grammar};
use crate::logprobs::{self, LogprobsWriter};
use crate::metrics::{self, Metrics, Snapshot};
use crate::reasoning::{self, ReasoningFormat, ReasoningSplit, ThinkingBlock};
use crate::tools::{self, ToolFormat};
use crate::{Event, FinishReason, Job, Logprobs, Scheduler, SubmitError};

/// How the server behaves, from flags and environment.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// Other names a request's `model` may use (e.g. the MODEL argument).
    pub model_aliases: Vec<String>,
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    /// Origins whose browser requests get CORS headers; `*` allows any.
    pub allowed_origins: Vec<String>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Bodies being read or processed share a budget of this many times
    /// `max_body_bytes`.
    pub body_slots: usize,
    /// Bodies processed (parsed and tokenized) at once. The plan's
    /// `requests` term counts both.
    pub processing_slots: usize,
    /// How long a request's body may take to arrive, from the end of its
    /// headers (408 after).
    pub body_timeout: Duration,
    /// How long in-flight requests may run after SIGINT/SIGTERM.
    pub shutdown_timeout: Duration,
}

/// What serving needs once the model is loaded.
pub struct LoadedModel {
    pub scheduler: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the checkpoint ships no chat template (chat requests
    /// then get 400).
    pub template: Option<ChatTemplate>,
    /// Per-slot context: prompt + max_tokens of one request.
    pub context: usize,
    /// `(term, bytes)` of the plan served, for `/metrics` (on a GPU, the
    /// device's budget).
    pub plan: Vec<(String, u64)>,
    /// `(term, bytes)` of a GPU plan's host budget; empty on the CPU.
    pub host_plan: Vec<(String, u64)>,
    /// Reads the GPU's memory for `/metrics`; `None` on the CPU.
    pub device_memory: Option<metrics::DeviceProbe>,
}

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("starting the HTTP runtime: {0}")]
    Runtime(std::io::Error),
    #[error("listening for signals: {0}")]
    Signal(std::io::Error),
    #[error("loading the model: {0}")]
    Load(String),
}

struct Shared {
    config: ServerConfig,
    model: OnceLock<LoadedModel>,
    /// The constraint compiler for the model's vocabulary, built at the
    /// first constrained request.
    constraints: OnceLock<Result<Constraints, String>>,
    metrics: Metrics,
    started: u64,
    counter: AtomicU64,
    /// One permit per request body processed (parsed and tokenized) at
    /// once ([`ServerConfig::processing_slots`]).
    bodies: Arc<Semaphore>,
    /// One permit per KiB of request bodies held at once, read or being
    /// processed: `body_slots` x the body limit.
    body_budget: Arc<Semaphore>,
    /// Becomes true when the shutdown timeout cuts off what still runs.
    cut: watch::Sender<bool>,
}

/// Serves on `listener` until SIGINT or SIGTERM. `load` runs on its own
/// thread while the listener already answers; an error from it ends
/// serving with [`ServeError::Load`]. `on_ready` is called once the model
/// is loaded.
pub fn serve(
    listener: std::net::TcpListener,
    config: ServerConfig,
    load: impl FnOnce() -> Result<LoadedModel, String> + Send + 'static,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fathom-http")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let processing_slots = config.processing_slots.max(1);
    let budget_kib = config
        .body_slots
        .max(1)
        .saturating_mul(config.max_body_bytes.div_ceil(1024))
        .min(Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        config,
        model: OnceLock::new(),
        constraints: OnceLock::new(),
        metrics: Metrics::default(),
        started: unix_now(),
        counter: AtomicU64::new(0),
        bodies: Arc::new(Semaphore::new(processing_slots)),
        body_budget: Arc::new(Semaphore::new(budget_kib)),
        cut: watch::Sender::new(false),
    });
    let result = runtime.block_on(run(listener, shared.clone(), load, on_ready));
    if let Some(model) = shared.model.get() {
        model.scheduler.shutdown();
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn run(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    load: impl FnOnce() -> Result<LoadedModel, String> + Send + 'static,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
    listener
        .set_nonblocking(true)
        .map_err(ServeError::Runtime)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServeError::Runtime)?;

    let (load_failed_tx, mut load_failed) = tokio::sync::oneshot::channel::<String>();
    {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("fathom-load".into())
            .spawn(move || match load() {
                Ok(model) => {
                    let _ = shared.model.set(model);
                    on_ready();
                }
                Err(e) => {
                    let _ = load_failed_tx.send(e);
                }
            })
            .map_err(ServeError::Runtime)?;
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut loading = true;
    let outcome = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, go on.
                        eprintln!("warning: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                connections.spawn(connection(stream, shared.clone(), stop_rx.clone()));
                while connections.try_join_next().is_some() {}
            }
            failed = &mut load_failed, if loading => match failed {
                Ok(message) => break Err(ServeError::Load(message)),
                // The loader succeeded (and dropped its sender).
                Err(_) => loading = false,
            },
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
        }
    };
    drop(listener);
    let _ = stop_tx.send(true);
    // Requests still waiting for a slot will not run: they fail now (503)
    // rather than wait out the timeout.
    if let Some(model) = shared.model.get() {
        model.scheduler.begin_shutdown();
    }
    let timeout = shared.config.shutdown_timeout;
    let drained = tokio::time::timeout(timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "warning: requests still running {} s after the shutdown signal were cut off",
            timeout.as_secs()
        );
        // Each cut stream sends an error event and ends its chunked body
        // properly; each waiting whole request gets a 503. Then the
        // connections have a moment to send that before they are dropped.
        let _ = shared.cut.send(true);
        let flushed = tokio::time::timeout(CUT_GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if flushed.is_err() {
            connections.shutdown().await;
        }
    }
    outcome
}

/// How long cut-off responses have to reach their clients after the
/// shutdown timeout, before their connections are dropped.
const CUT_GRACE: Duration = Duration::from_secs(2);

async fn connection(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(req, &shared).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .serve_connection(TokioIo::new(crate::wire::ErrorBodies::new(stream)), service);
    tokio::pin!(conn);
    let stopping = async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    };
    tokio::select! {
        _ = conn.as_mut() => {}
        () = stopping => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A response body: a whole buffer, or an event stream.
pub enum Body {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Body::Sse(sse) => sse.poll_next(cx).map(|d| d.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Body::Sse(_) => SizeHint::default(),
        }
    }
}

type Resp = Response<Body>;

fn response(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut resp = Response::new(Body::Full(Some(body.into())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_response(status: u16, value: &Value) -> Resp {
    response(status, "application/json", value.to_string())
}

fn error_response(e: &ApiError) -> Resp {
    let mut resp = json_response(e.status, &e.to_json());
    if e.status == 503 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if e.status == 408 {
        // The rest of the body may still be on its way: the connection
        // cannot be reused.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if e.status == 401 {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// The routes, each with its metrics label and allowed method.
fn route_of(path: &str) -> Option<(&'static str, Method)> {
    Some(match path {
        "/health" => ("/health", Method::GET),
        "/metrics" => ("/metrics", Method::GET),
        "/v1/models" => ("/v1/models", Method::GET),
        "/v1/chat/completions" => ("/v1/chat/completions", Method::POST),
        "/v1/completions" => ("/v1/completions", Method::POST),
        p if p.starts_with("/v1/models/") => ("/v1/models/{model}", Method::GET),
        _ => return None,
    })
}

async fn handle(req: Request<Incoming>, shared: &Arc<Shared>) -> Resp {
    let arrived = Instant::now();
    let origin = allowed_origin(&shared.config, req.headers());
    let route = route_of(req.uri().path());
    let label = route.as_ref().map_or("other", |(label, _)| label);
    let mut resp = match route {
        None => error_response(
            &ApiError::new(
                404,
                "invalid_request_error",
                format!("no route {} {}", req.method(), req.uri().path()),
            )
            .with_code("not_found"),
        ),
        Some((_, allowed)) if req.method() == Method::OPTIONS => {
            preflight(&allowed, origin.is_some(), req.headers())
        }
        Some((_, allowed)) if req.method() != allowed => {
            let mut resp = error_response(
                &ApiError::new(
                    405,
                    "invalid_request_error",
                    format!(
                        "{} does not take {}; use {allowed}",
                        req.uri().path(),
                        req.method()
                    ),
                )
                .with_code("method_not_allowed"),
            );
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_str(allowed.as_str()).unwrap_or(HeaderValue::from_static("GET")),
            );
            resp
        }
        Some((label, _)) => match authorize(&shared.config, label, req.headers()) {
            Err(e) => error_response(&e),
            Ok(()) => dispatch(label, req, shared, arrived)
                .await
                .unwrap_or_else(|e| error_response(&e)),
        },
    };
    if let Some(origin) = origin {
        let headers = resp.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    shared.metrics.request(label, resp.status().as_u16());
    resp
}

async fn dispatch(
    label: &'static str,
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    arrived: Instant,
) -> Result<Resp, ApiError> {
    match label {
        "/health" => Ok(match shared.model.get() {
            Some(_) => json_response(200, &json!({"status": "ok"})),
            None => {
                let mut resp = json_response(503, &json!({"status": "loading"}));
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                resp
            }
        }),
        "/metrics" => {
            let model = shared.model.get();
            let text = shared.metrics.render(&Snapshot {
                loaded: model.is_some(),
                stats: model.map(|m| m.scheduler.stats()),
                plan: model.map_or(&[], |m| &m.plan),
                host_plan: model.map_or(&[], |m| &m.host_plan),
                resident_bytes: metrics::resident_bytes(),
                device: model
                    .and_then(|m| m.device_memory.as_ref())
                    .and_then(|read| read()),
            });
            Ok(response(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            ))
        }
        "/v1/models" => Ok(json_response(
            200,
            &json!({"object": "list", "data": [model_object(shared)]}),
        )),
        "/v1/models/{model}" => {
            let id = req.uri().path().trim_start_matches("/v1/models/");
            if known_model(&shared.config, id) {
                Ok(json_response(200, &model_object(shared)))
            } else {
                Err(unknown_model(&shared.config, id, None))
            }
        }
        "/v1/chat/completions" => generate(Route::Chat, req, shared, arrived).await,
        _ => generate(Route::Completion, req, shared, arrived).await,
    }
}

fn model_object(shared: &Shared) -> Value {
    json!({
        "id": shared.config.model_id,
        "object": "model",
        "created": shared.started,
        "owned_by": "fathom",
    })
}

fn known_model(config: &ServerConfig, name: &str) -> bool {
    name == config.model_id || config.model_aliases.iter().any(|a| a == name)
}

fn unknown_model(config: &ServerConfig, name: &str, param: Option<&str>) -> ApiError {
    ApiError {
        param: param.map(str::to_string),
        ..ApiError::new(
            404,
            "invalid_request_error",
            format!(
                "the model {name:?} does not exist here; this server serves {:?}",
                config.model_id
            ),
        )
        .with_code("model_not_found")
    }
}

/// The request's Origin when CORS is on and it is allowed.
fn allowed_origin(config: &ServerConfig, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?;
    let text = origin.to_str().ok()?;
    config
        .allowed_origins
        .iter()
        .any(|o| o == "*" || o == text)
        .then(|| origin.clone())
}

fn preflight(allowed: &Method, cors: bool, headers: &HeaderMap) -> Resp {
    let mut resp = Response::new(Body::Full(None));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let methods = format!("{allowed}, OPTIONS");
    let h = resp.headers_mut();
    h.insert(
        header::ALLOW,
        HeaderValue::from_str(&methods).unwrap_or(HeaderValue::from_static("OPTIONS")),
    );
    if cors {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_str(&methods).unwrap_or(HeaderValue::from_static("OPTIONS")),
        );
        let asked = headers
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or(HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    resp
}

fn authorize(config: &ServerConfig, label: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &config.api_key else {
        return Ok(());
    };
    if label == "/health" {
        return Ok(());
    }
    // The scheme is case-insensitive (RFC 7235 section 2.1).
    let given = headers.get(header::AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &v[7..])
    });
    let fail = |message: &str| {
        Err(ApiError::new(401, "authentication_error", message).with_code("invalid_api_key"))
    };
    match given {
        None => fail("an API key is required: send the header Authorization: Bearer KEY"),
        Some(given) if constant_time_eq(given.trim_ascii(), key.as_bytes()) => Ok(()),
        Some(_) => fail("the API key in the Authorization header is not valid"),
    }
}

/// Compares without an early exit, so the time taken does not tell how
/// much of the key was right.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    diff == 0
}

/// A body read within the shared byte budget, with the budget it holds.
struct ReadBody {
    bytes: Bytes,
    _budget: Option<OwnedSemaphorePermit>,
}

/// Reads a body of at most `limit` bytes. Every KiB takes a permit of
/// `budget` (all bodies being read or processed share it, so together
/// they hold at most the plan's bytes): a declared `Content-Length` all
/// at once before reading, a chunked body as it arrives. The permits go
/// with the body.
///
/// By `deadline` the body must be in (else 408 `request_timeout`), and
/// its share of the budget taken (else 503 `server_busy`: the budget was
/// held by other bodies, no fault of this client).
async fn read_body(
    req: Request<Incoming>,
    limit: usize,
    budget: &Arc<Semaphore>,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<ReadBody, ApiError> {
    let take = |kib: usize| {
        let budget = budget.clone();
        async move {
            let n = u32::try_from(kib).unwrap_or(u32::MAX);
            match tokio::time::timeout_at(deadline, budget.acquire_many_owned(n)).await {
                Ok(Ok(permit)) => Ok(permit),
                Ok(Err(_)) | Err(_) => Err(busy()),
            }
        }
    };
    let timed_out = || {
        ApiError::new(
            408,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ),
        )
        .with_code("request_timeout")
    };
    let too_large = || {
        ApiError::new(
            413,
            "invalid_request_error",
            format!("the request body is over the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = req.into_body();
    // Each frame is copied in as it comes and dropped, so a body with a
    // declared length is held once (plus one frame), never twice.
    let capacity = declared.map_or(0, |n| usize::try_from(n).unwrap_or(limit).min(limit));
    let mut whole: Vec<u8> = Vec::with_capacity(capacity);
    let (mut len, mut held_kib) = (0usize, 0usize);
    let mut held: Option<OwnedSemaphorePermit> = None;
    // A declared length takes its whole share at once: bodies that each
    // hold part of the budget while waiting for the rest could wait on
    // each other until they time out.
    if let Some(n) = declared.filter(|&n| n > 0) {
        let kib = usize::try_from(n).unwrap_or(usize::MAX).div_ceil(1024);
        held = Some(take(kib).await?);
        held_kib = kib;
    }
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return Err(timed_out()),
        };
        let frame = frame.map_err(|e| {
            ApiError::new(
                400,
                "invalid_request_error",
                format!("reading the request body: {e}"),
            )
            .with_code("invalid_body")
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(too_large());
        }
        let kib = len.div_ceil(1024);
        if kib > held_kib {
            let more = take(kib - held_kib).await?;
            match &mut held {
                Some(permit) => permit.merge(more),
                None => held = Some(more),
            }
            held_kib = kib;
        }
        whole.extend_from_slice(&data);
    }
    Ok(ReadBody {
        bytes: Bytes::from(whole),
        _budget: held,
    })
}

fn busy() -> ApiError {
    ApiError::new(
        503,
        "server_error",
        "the server is busy: the request-body budget stayed taken; retry shortly",
    )
    .with_code("server_busy")
}

fn loading() -> ApiError {
    ApiError::new(
        503,
        "server_error",
        "the model is still loading; retry shortly",
    )
    .with_code("model_loading")
}

/// JSON values a body may hold when the context is `context` tokens: a
/// prompt of token ids as long as the context, plus the rest of a request.
fn max_json_values(context: usize) -> usize {
    context.saturating_add(api::STRUCTURE_VALUES)
}

fn cut_off() -> ApiError {
    ApiError::new(
        503,
        "server_error",
        "the server is shutting down: this request was cut off at --shutdown-timeout",
    )
    .with_code("shutting_down")
}

fn refused_at_shutdown() -> ApiError {
    ApiError::new(
        503,
        "server_error",
        "the server is shutting down: this request was still waiting for a slot and did not run",
    )
    .with_code("shutting_down")
}

/// A request read, parsed, checked and tokenized: what a job needs.
struct Prepared {
    request: GenerationRequest,
    prompt: Vec<u32>,
    max_tokens: usize,
    /// The compiled constraint of the answer, if any.
    constraint: Option<Box<ConstraintState>>,
    /// The functions the answer may call, and the format it writes them in.
    tools: Option<(ToolFormat, api::ToolRequest)>,
    /// The prompt as the response's text shows it, when echoed.
    echo: Option<String>,
    /// A thinking model's markers, and whether the prompt opened the block.
    reasoning: Option<(ReasoningFormat, bool)>,
}

async fn generate(
    route: Route,
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    arrived: Instant,
) -> Result<Resp, ApiError> {
    // The body's time runs from the end of the headers.
    let deadline = tokio::time::Instant::from_std(arrived) + shared.config.body_timeout;
    let body = read_body(
        req,
        shared.config.max_body_bytes,
        &shared.body_budget,
        deadline,
        shared.config.body_timeout,
    )
    .await?;
    // Parsing and tokenizing multiply a body's bytes for a moment: at most
    // `processing_slots` bodies are processed at once. Waiting for a turn is
    // short (the work is bounded by the context), but bounded too.
    let permit = match tokio::time::timeout(
        shared.config.body_timeout,
        shared.bodies.clone().acquire_owned(),
    )
    .await
    {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) | Err(_) => return Err(busy()),
    };
    if shared.model.get().is_none() {
        return Err(loading());
    }
    // Parsing and tokenizing take CPU in proportion to the body: they run
    // on the blocking pool, never on the threads that answer /health, and
    // the permit goes with them, so at most `processing_slots` run at once even
    // when their clients have gone.
    let seed = fresh_seed(shared);
    let prepared = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || prepare(route, body, seed, &shared, permit))
            .await
            .map_err(|e| {
                ApiError::new(500, "server_error", format!("preparing the request: {e}"))
            })??
    };
    let model = shared.model.get().ok_or_else(loading)?;
    let Prepared {
        request,
        prompt,
        max_tokens,
        echo,
        constraint,
        tools,
        reasoning,
    } = prepared;
    let (events, receiver) = unbounded_channel();
    let GenerationRequest {
        sampling,
        stop,
        stream,
        include_usage,
        logprobs,
        ..
    } = request;
    let logprobs = logprobs.map(|top| Logprobs {
        top,
        prompt: echo.is_some(),
    });
    model
        .scheduler
        .submit(Job {
            prompt,
            max_tokens,
            sampling,
            stop,
            logprobs,
            constraint,
            events,
        })
        .map_err(|e| {
            let code = match e {
                SubmitError::QueueFull => "server_busy",
                SubmitError::ShuttingDown => "shutting_down",
            };
            ApiError::new(503, "server_error", e.to_string()).with_code(code)
        })?;
    let format = Format {
        route,
        id: format!(
            "{}-{}",
            if route == Route::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            random_hex(shared)
        ),
        created: unix_now(),
        model: shared.config.model_id.clone(),
        include_usage,
        echo,
        tools,
        reasoning,
    };
    let writer = logprobs.map(|_| LogprobsWriter::new(route, model.tokenizer.clone()));
    let timing = Timing {
        arrived,
        last: None,
        shared: shared.clone(),
    };
    let cut = cut_signal(shared);
    if stream {
        let mut pending = VecDeque::new();
        if route == Route::Chat {
            pending.push_back(sse(&format.chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                None,
            )));
        }
        if let (Some(echo), None) = (&format.echo, &writer) {
            // Without logprobs the echo goes first; with them, it goes
            // with the prompt's logprobs when they come.
            pending.push_back(sse(&format.chunk(
                json!({"content": echo}),
                Value::Null,
                None,
            )));
        }
        let split = format
            .reasoning
            .map(|(f, inside)| ReasoningSplit::new(f, inside));
        let mut resp = Response::new(Body::Sse(Box::new(SseBody {
            events: receiver,
            format,
            writer,
            pending,
            split,
            held: String::new(),
            held_logprobs: Value::Null,
            done: false,
            timing,
            cut,
        })));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(resp)
    } else {
        tokio::select! {
            whole = collect(receiver, &format, writer, timing) => whole,
            () = cut => Err(cut_off()),
        }
    }
}

/// Resolves once the shutdown timeout cuts requests off.
fn cut_signal(shared: &Shared) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let mut cut = shared.cut.subscribe();
    Box::pin(async move {
        let _ = cut.wait_for(|cut| *cut).await;
    })
}

/// Parses, checks and tokenizes a body; runs on the blocking pool holding
/// one of the `processing_slots` permits.
fn prepare(
    route: Route,
    body: ReadBody,
    seed: u64,
    shared: &Shared,
    _permit: OwnedSemaphorePermit,
) -> Result<Prepared, ApiError> {
    let model = shared.model.get().ok_or_else(loading)?;
    let request = api::parse_bounded(route, &body.bytes, seed, max_json_values(model.context))?;
    drop(body);
    if let Some(name) = &request.model {
        if !known_model(&shared.config, name) {
            return Err(unknown_model(&shared.config, name, Some("model")));
        }
    }
    let vocab = model.tokenizer.vocab_size();
    if let Some((id, _)) = request
        .sampling
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias names token {id}, but the vocabulary has {vocab} tokens (0 to {})",
                vocab.saturating_sub(1)
            ),
        ));
    }
    let prompt_param = match route {
        Route::Chat => "messages",
        Route::Completion => "prompt",
    };
    // The prompt may have at most this many tokens and still leave room
    // for what is asked: tokenizing stops past it.
    let limit = model
        .context
        .saturating_sub(request.max_tokens.unwrap_or(1));
    // Function calling: the conversation and the constraint as the
    // model's tool format has them.
    let format = ToolFormat::detect(model.tokenizer.chat_template());
    let tool_prep = match (&request.tools, &request.prompt) {
        (Some(req), Prompt::Chat(messages)) => Some(tools::prepare(format, messages, req)),
        _ => None,
    };
    let prompt = tokenize(model, &request, tool_prep.as_ref(), limit).map_err(|e| match e {
        Tokenized::Err(e) => e,
        Tokenized::TooMany => {
            exceeded_while_tokenizing(model.context, limit, request.max_tokens, prompt_param)
        }
    })?;
    let max_tokens = admit(
        model.context,
        prompt.len(),
        request.max_tokens,
        prompt_param,
    )?;
    let echo = request.echo.then(|| match &request.prompt {
        Prompt::Text(text) => text.clone(),
        Prompt::Tokens(ids) => model.tokenizer.decode(ids, true),
        // The parser takes echo on /v1/completions only.
        Prompt::Chat(_) => String::new(),
    });
    // A thinking model's chat prompt may leave it inside a thinking block
    // (Qwen3.5's template opens one): the answer starts there. With
    // thinking on and no block opened (Qwen3, Gemma 4), the model opens
    // one itself.
    let thinking = match request.prompt {
        Prompt::Chat(_) => ReasoningFormat::detect(model.tokenizer.chat_template())
            .map(|f| (f, f.prompt_block(&model.tokenizer, &prompt))),
        _ => None,
    };
    let block = thinking.and_then(|(_, block)| block);
    // A harmony model's chat answer: its analysis message is bounded
    // (`thinking_budget_tokens`, else half of max_tokens) wherever a
    // constraint follows it, so the constrained message always comes; so
    // is a thinking block, which a constraint must let close before its
    // own part begins.
    let harmony = format == ToolFormat::Harmony && matches!(request.prompt, Prompt::Chat(_));
    if request.thinking_budget.is_some() && !harmony && block.is_none() {
        return Err(ApiError::invalid(
            "thinking_budget_tokens",
            "thinking_budget_tokens bounds the model's thinking: the analysis channel of a harmony (gpt-oss) chat template, or a thinking block of a chat template with thinking on (one the template opens, as Qwen3.5's, or the model's own, as Qwen3's and Gemma 4's); this prompt has thinking off or no thinking format",
        )
        .with_code("unsupported_parameter"));
    }
    // A grammar writes the whole answer where the model writes all of it,
    // its own thinking block or harmony messages included; only a block
    // the prompt opened comes before it.
    let grammar_whole = harmony || matches!(block, Some(ThinkingBlock::Own { .. }));
    let reasoning_bound = reasoning::reasoning_bound(request.thinking_budget, max_tokens);
    let bounded = request.thinking_budget.is_some_and(|b| b != usize::MAX);
    let wanted = match &request.constraint {
        None => {
            let tool_grammar = match (&request.tools, &request.prompt) {
                (Some(req), Prompt::Chat(_)) => {
                    let own_block = match block {
                        Some(ThinkingBlock::Own { open, .. }) => Some(open),
                        _ => None,
                    };
                    Some(
                        tools::grammar(
                            format,
                            req,
                            reasoning_bound,
                            tools::python_tag(&model.tokenizer),
                            own_block,
                        )
                        .map_err(|e| {
                            ApiError::invalid("tools", format!("tools cannot be enforced: {e}"))
                                .with_code("invalid_grammar")
                        })?,
                    )
                }
                _ => None,
            };
            match (tool_grammar, block) {
                (Some(grammar), _) => Some(("tools", "invalid_grammar", grammar)),
                // A budget on an answer otherwise free (-1 leaves it free).
                (None, _) if harmony && bounded => Some((
                    "thinking_budget_tokens",
                    "invalid_grammar",
                    reasoning::harmony_bounded(reasoning_bound),
                )),
                // The block bounded, any text after it.
                (None, Some(block)) if bounded => Some((
                    "thinking_budget_tokens",
                    "invalid_grammar",
                    Grammar::Thinking {
                        block,
                        reasoning: reasoning_bound,
                        then: None,
                    },
                )),
                (None, _) => None,
            }
        }
        Some((param, c)) => {
            // A harmony model's chat answer keeps its analysis message and
            // its final channel's header; the JSON is that channel's body.
            let (grammar, code) = match c {
                OutputConstraint::JsonObject if harmony => (
                    reasoning::harmony_final_json(
                        &serde_json::json!({"type": "object"}),
                        reasoning_bound,
                    ),
                    "invalid_schema",
                ),
                OutputConstraint::JsonObject => (Grammar::JsonObject, "invalid_schema"),
                OutputConstraint::JsonSchema(schema) if harmony => (
                    reasoning::harmony_final_json(schema, reasoning_bound),
                    "invalid_schema",
                ),
                OutputConstraint::JsonSchema(schema) => {
                    (Grammar::JsonSchema(schema.clone()), "invalid_schema")
                }
                OutputConstraint::Gbnf(_) if grammar_whole && request.thinking_budget.is_some() => {
                    return Err(ApiError::invalid(
                        "thinking_budget_tokens",
                        "thinking_budget_tokens cannot bound an answer that a GBNF grammar writes whole, its reasoning included: bound the reasoning in the grammar",
                    )
                    .with_code("unsupported_parameter"))
                }
                OutputConstraint::Gbnf(text) => (Grammar::Gbnf(text.clone()), "invalid_grammar"),
            };
            Some((*param, code, grammar))
        }
    };
    let constraint = match wanted {
        Some((param, code, grammar)) => {
            // The constrained part follows the thinking block, but for a
            // grammar that writes the whole answer (and a budget alone,
            // already the block).
            let whole = match grammar {
                Grammar::Thinking { .. } => true,
                Grammar::Gbnf(_) => grammar_whole,
                _ => false,
            };
            let grammar = match block {
                Some(block) if !whole => Grammar::Thinking {
                    block,
                    reasoning: reasoning_bound,
                    then: Some(Box::new(grammar)),
                },
                _ => grammar,
            };
            Some(compile(shared, model, param, code, &grammar)?)
        }
        None => None,
    };
    let tools = request.tools.clone().map(|t| (format, t));
    let reasoning = thinking
        .map(|(f, block)| (f, matches!(block, Some(ThinkingBlock::Opened { .. }))))
        .filter(|_| request.split_reasoning);
    Ok(Prepared {
        request,
        prompt,
        max_tokens,
        echo,
        constraint,
        tools,
        reasoning,
    })
}

/// Compiles `grammar` for the request field `param` (a 400 naming it,
/// with `code`, when the engine refuses it).
fn compile(
    shared: &Shared,
    model: &LoadedModel,
    param: &str,
    code: &'static str,
    grammar: &Grammar,
) -> Result<Box<ConstraintState>, ApiError> {
    let constraints = shared
        .constraints
        .get_or_init(|| Constraints::new(&model.tokenizer, model.tokenizer.vocab_size()));
    let constraints = constraints
        .as_ref()
        .map_err(|e| ApiError::new(500, "server_error", e.clone()))?;
    constraints.compile(grammar).map(Box::new).map_err(|e| {
        ApiError::invalid(param, format!("{param} cannot be enforced: {}", e.message))
            .with_code(code)
    })
}

fn exceeded_while_tokenizing(
    context: usize,
    limit: usize,
    max_tokens: Option<usize>,
    prompt_param: &str,
) -> ApiError {
    let (param, message) = match max_tokens {
        Some(n) => (
            "max_tokens",
            format!(
                "this server's context is {context} tokens per request, and max_tokens asks for {n}, leaving {limit} for the prompt, but the prompt has more than {limit} tokens: shorten the prompt or lower max_tokens"
            ),
        ),
        None => (
            prompt_param,
            format!(
                "this server's context is {context} tokens per request, and the prompt has more than {limit} tokens, leaving none to generate: shorten the prompt"
            ),
        ),
    };
    ApiError {
        param: Some(param.into()),
        ..ApiError::new(400, "invalid_request_error", message).with_code("context_length_exceeded")
    }
}

enum Tokenized {
    Err(ApiError),
    /// More tokens than the limit.
    TooMany,
}

impl From<ApiError> for Tokenized {
    fn from(e: ApiError) -> Self {
        Tokenized::Err(e)
    }
}

impl From<TooManyTokens> for Tokenized {
    fn from(_: TooManyTokens) -> Self {
        Tokenized::TooMany
    }
}

/// The prompt's tokens, at most `limit` of them. Message content and
/// completion prompts are text: control-token texts in them stay text
/// (unless a completion asks for `parse_special`); only the chat
/// template's own markers become special tokens.
fn tokenize(
    model: &LoadedModel,
    request: &GenerationRequest,
    tool_prep: Option<&tools::Prepared>,
    limit: usize,
) -> Result<Vec<u32>, Tokenized> {
    let tokenizer = &model.tokenizer;
    let tokens = match &request.prompt {
        Prompt::Chat(messages) => {
            let Some(template) = &model.template else {
                return Err(ApiError::new(
                    400,
                    "invalid_request_error",
                    "this model has no chat template: use /v1/completions with a raw prompt",
                )
                .into());
            };
            let (messages, tools) = match tool_prep {
                Some(p) => (&p.messages[..], p.tools.as_ref()),
                None => (&messages[..], None),
            };
            let kwargs = request.template_kwargs.as_ref();
            encode_chat_tools(tokenizer, template, messages, tools, kwargs, true, limit).map_err(
                |e| match e {
                    ChatEncodeError::Template(e) => Tokenized::Err(ApiError::invalid(
                        "messages",
                        format!("the chat template refused the messages: {e}"),
                    )),
                    ChatEncodeError::ControlText { ref param, .. } => {
                        Tokenized::Err(ApiError::invalid(param, e.to_string()))
                    }
                    ChatEncodeError::TooMany(_) => Tokenized::TooMany,
                },
            )?
        }
        Prompt::Text(text) => {
            let special = if request.parse_special {
                Special::Parse
            } else {
                Special::Plain
            };
            tokenizer.encode_bounded(text, tokenizer.add_bos(), special, limit)?
        }
        Prompt::Tokens(ids) => {
            let vocab = tokenizer.vocab_size();
            if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("prompt[{i}] is token {id}, but the vocabulary has {vocab} tokens (0 to {})", vocab.saturating_sub(1)),
                )
                .into());
            }
            if ids.len() > limit {
                return Err(Tokenized::TooMany);
            }
            ids.clone()
        }
    };
    if tokens.is_empty() {
        let param = if matches!(request.prompt, Prompt::Chat(_)) {
            "messages"
        } else {
            "prompt"
        };
        return Err(
            ApiError::invalid(param, "the prompt is empty: give at least one token").into(),
        );
    }
    Ok(tokens)
}

/// The tokens to generate, checked against the per-slot context. `prompt_param`
/// names the field holding the prompt (`messages` or `prompt`).
pub fn admit(
    context: usize,
    prompt: usize,
    max_tokens: Option<usize>,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    let exceeded = |param: &str, message: String| ApiError {
        param: Some(param.into()),
        ..ApiError::new(400, "invalid_request_error", message).with_code("context_length_exceeded")
    };
    match max_tokens {
        Some(n) if prompt.saturating_add(n) > context => Err(exceeded(
            "max_tokens",
            format!(
                "this server's context is {context} tokens per request, but the prompt has {prompt} tokens and max_tokens asks for {n} more ({} in all): shorten the prompt or lower max_tokens",
                prompt.saturating_add(n)
            ),
        )),
        Some(n) => Ok(n),
        None if prompt >= context => Err(exceeded(
            prompt_param,
            format!(
                "this server's context is {context} tokens per request, and the prompt has {prompt} tokens, leaving none to generate: shorten the prompt"
            ),
        )),
        None => Ok(context - prompt),
    }
}

/// The fixed parts of every object one response sends.
struct Format {
    route: Route,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// The prompt's text, sent back first (completions' `echo`).
    echo: Option<String>,
    /// The functions the answer may call: its text is held back and read
    /// as calls or content when it is complete.
    tools: Option<(ToolFormat, api::ToolRequest)>,
    /// A thinking model's markers (chat, unless `reasoning_format` is
    /// `none`), and whether the answer starts inside the block.
    reasoning: Option<(ReasoningFormat, bool)>,
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

impl Format {
    fn object(&self, stream: bool) -> &'static str {
        match (self.route, stream) {
            (Route::Chat, true) => "chat.completion.chunk",
            (Route::Chat, false) => "chat.completion",
            (Route::Completion, _) => "text_completion",
        }
    }

    /// A stream chunk: `delta` is the chat delta, or `{"content": ...}`
    /// for a completion's text; `logprobs` those of its tokens (or null).
    fn chunk(&self, delta: Value, logprobs: Value, finish: Option<FinishReason>) -> Value {
        let finish = finish.map(FinishReason::as_str);
        let choice = match self.route {
            Route::Chat => {
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Route::Completion => json!({
                "text": delta.get("content").cloned().unwrap_or(json!("")),
                "index": 0, "logprobs": logprobs, "finish_reason": finish,
            }),
        };
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The last chunk of a choice, with its finish reason.
    fn chunk_finish(&self, delta: Value, finish: &str) -> Value {
        let mut v = self.chunk(delta, Value::Null, None);
        v["choices"][0]["finish_reason"] = json!(finish);
        v
    }

    fn usage_chunk(&self, usage: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        })
    }

    /// A whole answer's reasoning (when the model thinks, and wrote some)
    /// and the rest of its text.
    fn split_reasoning(&self, text: String) -> (Option<String>, String) {
        match self.reasoning {
            None => (None, text),
            Some((format, inside)) => {
                let parts = ReasoningSplit::split(format, inside, &text);
                let reasoning = (!parts.reasoning.is_empty()).then_some(parts.reasoning);
                (reasoning, parts.content)
            }
        }
    }

    /// The answer as content and calls, and the finish reason to report
    /// (`tool_calls` when it called functions).
    fn answer(&self, text: String, finish: FinishReason) -> (tools::Answer, &'static str) {
        match &self.tools {
            None => (
                tools::Answer {
                    content: Some(text),
                    calls: Vec::new(),
                },
                finish.as_str(),
            ),
            Some((format, req)) => {
                let hex = self
                    .id
                    .rsplit('-')
                    .next()
                    .unwrap_or("")
                    .get(..12)
                    .unwrap_or("");
                let answer = tools::parse(*format, &text, req, hex);
                let reason = if answer.calls.is_empty() || finish != FinishReason::Stop {
                    finish.as_str()
                } else {
                    "tool_calls"
                };
                (answer, reason)
            }
        }
    }

    fn whole(&self, text: String, logprobs: Value, finish: FinishReason, usage: Value) -> Value {
        let choice = match self.route {
            Route::Chat => {
                let (reasoning, text) = self.split_reasoning(text);
                let (answer, reason) = self.answer(text, finish);
                let mut message = json!({"role": "assistant", "content": answer.content});
                if let Some(reasoning) = reasoning {
                    message["reasoning_content"] = json!(reasoning);
                }
                if !answer.calls.is_empty() {
                    message["tool_calls"] = Value::Array(
                        answer
                            .calls
                            .iter()
                            .map(|c| {
                                json!({"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments}})
                            })
                            .collect(),
                    );
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
            Route::Completion => json!({
                "text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        })
    }
}

/// Latency measured as events arrive: time to first text, then between texts.
struct Timing {
    arrived: Instant,
    last: Option<Instant>,
    shared: Arc<Shared>,
}

impl Timing {
    fn text(&mut self) {
        let now = Instant::now();
        let m = &self.shared.metrics;
        match self.last {
            None => m.time_to_first_token.observe(now - self.arrived),
            Some(last) => m.inter_token_latency.observe(now - last),
        }
        self.last = Some(now);
    }
}

fn engine_failed(message: &str) -> ApiError {
    ApiError::new(500, "server_error", format!("generation failed: {message}"))
}

async fn collect(
    mut events: UnboundedReceiver<Event>,
    format: &Format,
    mut writer: Option<LogprobsWriter>,
    mut timing: Timing,
) -> Result<Resp, ApiError> {
    let mut text = format.echo.clone().unwrap_or_default();
    let mut all = writer.as_ref().map_or(Value::Null, LogprobsWriter::empty);
    loop {
        match events.recv().await {
            Some(Event::PromptLogprobs { first, rest }) => {
                if let (Some(w), Some(echo)) = (&mut writer, &format.echo) {
                    logprobs::join(&mut all, w.prompt(first, &rest, echo));
                }
            }
            Some(Event::Text {
                text: piece,
                logprobs: entries,
            }) => {
                timing.text();
                text.push_str(&piece);
                if let Some(w) = &mut writer {
                    logprobs::join(&mut all, w.generated(&entries));
                }
            }
            Some(Event::Finished {
                reason,
                constraint: _,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            }) => {
                let usage = usage(prompt_tokens, completion_tokens, cached_tokens);
                let whole = format.whole(text, all, reason, usage);
                return Ok(json_response(200, &whole));
            }
            Some(Event::Failed(message)) => return Err(engine_failed(&message)),
            Some(Event::ShuttingDown) => return Err(refused_at_shutdown()),
            None => {
                return Err(engine_failed(
                    "the scheduler stopped before the request finished",
                ))
            }
        }
    }
}

/// A stream delta of a split's parts; `None` when both are empty.
fn delta_of(parts: crate::reasoning::Parts) -> Option<Value> {
    let mut delta = serde_json::Map::new();
    if !parts.reasoning.is_empty() {
        delta.insert("reasoning_content".into(), json!(parts.reasoning));
    }
    if !parts.content.is_empty() {
        delta.insert("content".into(), json!(parts.content));
    }
    (!delta.is_empty()).then_some(Value::Object(delta))
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The body of a streamed response: one SSE event per scheduler event.
/// Dropping it (hyper does when the client goes away) drops the receiver,
/// which cancels the job.
pub struct SseBody {
    events: UnboundedReceiver<Event>,
    format: Format,
    /// Renders each chunk's logprobs, when asked for.
    writer: Option<LogprobsWriter>,
    pending: VecDeque<Bytes>,
    /// Splits a thinking model's reasoning off as it streams.
    split: Option<ReasoningSplit>,
    /// With tools: the answer so far, held back; and the logprobs of text
    /// held back (with tools, or a possible thinking marker).
    held: String,
    held_logprobs: Value,
    done: bool,
    timing: Timing,
    /// Resolves when the shutdown timeout cuts the stream off.
    cut: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl SseBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some(data) = self.pending.pop_front() {
                return Poll::Ready(Some(data));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.cut.as_mut().poll(cx).is_ready() {
                // The last event says why; ending the body then sends the
                // chunked encoding's terminating chunk.
                self.pending.push_back(sse(&cut_off().to_json()));
                self.done = true;
                continue;
            }
            let event = ready!(self.events.poll_recv(cx));
            let f = &self.format;
            match event {
                Some(Event::PromptLogprobs { first, rest }) => {
                    if let (Some(w), Some(echo)) = (&mut self.writer, &f.echo) {
                        let logprobs = w.prompt(first, &rest, echo);
                        let chunk = f.chunk(json!({"content": echo}), logprobs, None);
                        self.pending.push_back(sse(&chunk));
                    }
                }
                Some(Event::Text { text, logprobs }) => {
                    self.timing.text();
                    let logprobs = self
                        .writer
                        .as_mut()
                        .map_or(Value::Null, |w| w.generated(&logprobs));
                    if self.held_logprobs.is_null() {
                        self.held_logprobs = logprobs;
                    } else {
                        logprobs::join(&mut self.held_logprobs, logprobs);
                    }
                    if f.tools.is_some() {
                        // Held back until the answer is complete.
                        self.held.push_str(&text);
                        continue;
                    }
                    let delta = match &mut self.split {
                        None => Some(json!({"content": text})),
                        Some(split) => delta_of(split.push(&text)),
                    };
                    // Text a thinking marker may still claim waits, with
                    // its logprobs, for the next.
                    if let Some(delta) = delta {
                        let logprobs = std::mem::replace(&mut self.held_logprobs, Value::Null);
                        self.pending.push_back(sse(&f.chunk(delta, logprobs, None)));
                    }
                }
                Some(Event::Finished {
                    reason,
                    constraint: _,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                }) => {
                    let delta = match f.route {
                        Route::Chat => json!({}),
                        Route::Completion => json!({"content": ""}),
                    };
                    let mut finish = reason.as_str();
                    if let Some(delta) = self.split.as_mut().and_then(|s| delta_of(s.finish())) {
                        let logprobs = std::mem::replace(&mut self.held_logprobs, Value::Null);
                        self.pending.push_back(sse(&f.chunk(delta, logprobs, None)));
                    }
                    if f.tools.is_some() {
                        let (reasoning, text) = f.split_reasoning(std::mem::take(&mut self.held));
                        let (answer, r) = f.answer(text, reason);
                        finish = r;
                        let mut logprobs = std::mem::replace(&mut self.held_logprobs, Value::Null);
                        if let Some(reasoning) = reasoning {
                            let delta = json!({"reasoning_content": reasoning});
                            let logprobs = std::mem::replace(&mut logprobs, Value::Null);
                            self.pending.push_back(sse(&f.chunk(delta, logprobs, None)));
                        }
                        if let Some(content) = answer.content.filter(|c| !c.is_empty()) {
                            let chunk = f.chunk(json!({"content": content}), logprobs, None);
                            self.pending.push_back(sse(&chunk));
                        }
                        // Each call: its id, type and name first, then its
                        // arguments, as OpenAI streams them.
                        for (index, c) in answer.calls.iter().enumerate() {
                            let head = json!({"tool_calls": [{"index": index, "id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": ""}}]});
                            self.pending
                                .push_back(sse(&f.chunk(head, Value::Null, None)));
                            let args = json!({"tool_calls": [{"index": index,
                                "function": {"arguments": c.arguments}}]});
                            self.pending
                                .push_back(sse(&f.chunk(args, Value::Null, None)));
                        }
                    }
                    self.pending.push_back(sse(&f.chunk_finish(delta, finish)));
                    if f.include_usage {
                        let usage = usage(prompt_tokens, completion_tokens, cached_tokens);
                        self.pending.push_back(sse(&f.usage_chunk(usage)));
                    }
                    self.pending
                        .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.done = true;
                }
                Some(Event::Failed(message)) => {
                    self.pending
                        .push_back(sse(&engine_failed(&message).to_json()));
                    self.done = true;
                }
                Some(Event::ShuttingDown) => {
                    self.pending
                        .push_back(sse(&refused_at_shutdown().to_json()));
                    self.done = true;
                }
                None => {
                    let e = engine_failed("the scheduler stopped before the request finished");
                    self.pending.push_back(sse(&e.to_json()));
                    self.done = true;
                }
            }
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// SplitMix64 over the clock and a counter: distinct per call.
fn fresh_seed(shared: &Shared) -> u64 {
    let n = shared.counter.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn random_hex(shared: &Shared) -> String {
    format!(
        "{:016x}{:08x}",
        fresh_seed(shared),
        fresh_seed(shared) as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_matches_only_the_same_key() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret2", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        // A given byte equal to `!expected` must not cancel out a short key.
        assert!(!constant_time_eq(&[!b's'], b"s"));
    }

    #[test]
    fn admission_keeps_prompt_and_max_tokens_within_the_context() {
        assert_eq!(admit(100, 10, Some(90), "prompt"), Ok(90));
        assert_eq!(admit(100, 10, None, "prompt"), Ok(90));
        let e = admit(100, 10, Some(91), "prompt").unwrap_err();
        assert_eq!((e.status, e.code), (400, Some("context_length_exceeded")));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("101 in all"), "{}", e.message);
        let e = admit(100, 100, None, "messages").unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(
            admit(100, 1, Some(usize::MAX), "prompt").unwrap_err().code,
            Some("context_length_exceeded")
        );
    }

    #[test]
    fn routes_have_one_method_and_a_bounded_label() {
        assert_eq!(
            route_of("/v1/chat/completions"),
            Some(("/v1/chat/completions", Method::POST))
        );
        assert_eq!(
            route_of("/v1/models/x/y"),
            Some(("/v1/models/{model}", Method::GET))
        );
        assert_eq!(route_of("/v2/anything"), None);
    }
}

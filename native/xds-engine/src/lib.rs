//! `waypost_xds_engine`: an ADS server (state-of-the-world xDS over gRPC) in Rust, driven from Python.
//!
//! Python keeps what the resources are (registries, mapping, policy) and hands them over serialized:
//! `set_resources(type_url, {name: bytes}, version)`. The engine keeps the streams: per stream its node, per
//! type its subscribed names, the nonce of the last response, the version the client ACKed and the error of
//! its last NACK (`streams()`, for a CSDS view), and pushes to a stream only when a resource it subscribes to
//! changed. gRPC runs on tokio (tonic) in threads of its own; no call of this module holds the GIL while it
//! waits on them.

mod proto;
mod service;
mod state;

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tokio::net::TcpSocket;
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, Notify};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

use service::{Ads, Shared};
use state::{State, Subscription};

const TYPE_PREFIX: &str = "type.googleapis.com/";
/// the kernel caps it at net.core.somaxconn
const LISTEN_BACKLOG: u32 = 65535;

struct Running {
    runtime: Runtime,
    shutdown: oneshot::Sender<()>,
    port: u16,
}

/// An ADS server. `Engine(workers=None)`: tokio worker threads (default: one per core).
#[pyclass(module = "waypost_xds_engine")]
struct Engine {
    state: Shared,
    running: Mutex<Option<Running>>,
    workers: Option<usize>,
}

fn wake(notifies: Vec<Arc<Notify>>) {
    for w in notifies {
        w.notify_one();
    }
}

/// A listening socket with a backlog as deep as the system allows: a fleet reconnecting at once is thousands of
/// connections in a burst, and the default of 128 would drop their SYNs (each retried a second later).
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

fn check_type(type_url: &str) -> PyResult<()> {
    if !type_url.starts_with(TYPE_PREFIX) || type_url.len() == TYPE_PREFIX.len() {
        return Err(PyValueError::new_err(format!(
            "xds engine: type_url {type_url:?} is not a type URL; give the full one, e.g. \
             'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment'")));
    }
    Ok(())
}

/// {name: bytes} -> {name: encoded Any}: `packed`, the bytes are an encoded Any of `type_url` already (waypost's
/// snapshot keeps them so); else they are the resource's serialized message, wrapped here.
fn extract_items(resources: &Bound<'_, PyDict>, type_url: &str, packed: bool) -> PyResult<BTreeMap<String, Bytes>> {
    let mut items = BTreeMap::new();
    for (k, v) in resources.iter() {
        let name: String = k.extract().map_err(|_| {
            PyTypeError::new_err(format!("xds engine: resource name {k} is not a str; give {{name: bytes}}"))
        })?;
        let value = v.downcast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "xds engine: resource {name:?} is a {}, not bytes; give the serialized resource \
                 (message.SerializeToString())", v.get_type().name().map(|n| n.to_string()).unwrap_or_default()))
        })?;
        let data = Bytes::copy_from_slice(value.as_bytes());
        if packed {
            if !proto::is_any_of(&data, type_url) {
                return Err(PyValueError::new_err(format!(
                    "xds engine: resource {name:?} is not an encoded google.protobuf.Any of {type_url}; with \
                     packed=True give any_pb2.Any (packed) bytes, or give the message's bytes with packed=False")));
            }
            items.insert(name, data);
        } else {
            items.insert(name, proto::pack(type_url, data));
        }
    }
    Ok(items)
}

fn sub_dict<'py>(py: Python<'py>, sub: &Subscription) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("names", sub.names.iter().collect::<Vec<_>>())?;
    d.set_item("wildcard", sub.wildcard)?;
    d.set_item("acked_version", &sub.acked_version)?;
    d.set_item("sent_version", &sub.sent_version)?;
    d.set_item("last_nonce", &sub.last_nonce)?;
    d.set_item("nack_error", sub.nack_error.as_deref())?;
    d.set_item("nacked_version", &sub.nacked_version)?;
    d.set_item("acks", sub.acks)?;
    d.set_item("nacks", sub.nacks)?;
    Ok(d)
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (workers = None))]
    fn new(workers: Option<usize>) -> PyResult<Self> {
        if workers == Some(0) {
            return Err(PyValueError::new_err("xds engine: workers must be at least 1 (or None: one per core)"));
        }
        Ok(Engine { state: Arc::new(Mutex::new(State::default())), running: Mutex::new(None), workers })
    }

    /// Listen on `listen` ("HOST:PORT", port 0 picks one) and serve; returns the port. `max_connection_age`
    /// (seconds): a connection gets GOAWAY after about that long and its streams end `max_connection_age_grace`
    /// seconds later (gRPC clients open new ones, keeping their resources meanwhile).
    #[pyo3(signature = (listen, max_connection_age = None, max_connection_age_grace = 5.0))]
    fn start(&self, py: Python<'_>, listen: &str, max_connection_age: Option<f64>, max_connection_age_grace: f64)
             -> PyResult<u16> {
        let age = match max_connection_age {
            None => None,
            Some(a) if a.is_finite() && a > 0.0 && max_connection_age_grace >= 0.0 => Some(Duration::from_secs_f64(a)),
            Some(a) => {
                return Err(PyValueError::new_err(format!(
                    "xds engine: max_connection_age must be a number of seconds > 0 (or None: never), got {a}; \
                     max_connection_age_grace >= 0")));
            }
        };
        let mut running = self.running.lock().unwrap();
        if running.is_some() {
            return Err(PyRuntimeError::new_err("xds engine: already started; stop() it first"));
        }
        let addr: SocketAddr = listen.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
            PyValueError::new_err(format!("xds engine: cannot listen on {listen:?}: expected HOST:PORT"))
        })?;
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = self.workers {
            builder.worker_threads(n);
        }
        let runtime = py.allow_threads(|| builder.enable_all().thread_name("xds-engine").build())?;
        let listener = {
            let _in_runtime = runtime.enter();
            bind(addr).map_err(|e| PyOSError::new_err(format!("xds engine: cannot listen on {listen}: {e}")))?
        };
        let port = listener.local_addr()?.port();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let ads = Ads { state: self.state.clone() };
        self.state.lock().unwrap().stopping = false;
        runtime.spawn(async move {
            let incoming = TcpListenerStream::new(listener).map(|conn| {
                if let Ok(c) = &conn {
                    let _ = c.set_nodelay(true); // a push is one small write: send it now
                }
                conn
            });
            let mut server = tonic::transport::Server::builder();
            if let Some(age) = age {
                server = server.max_connection_age(age)
                    .max_connection_age_grace(Duration::from_secs_f64(max_connection_age_grace));
            }
            let served = server
                .add_service(ads)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("xds engine: server: {e}");
            }
        });
        *running = Some(Running { runtime, shutdown, port });
        Ok(port)
    }

    /// The port served on (None when not started).
    #[getter]
    fn port(&self) -> Option<u16> {
        self.running.lock().unwrap().as_ref().map(|r| r.port)
    }

    /// Replace every resource of `type_url` with `resources` ({name: serialized bytes}; `packed`: each an
    /// encoded google.protobuf.Any) at `version`; pushes to the streams subscribing to a name that changed.
    /// Returns how many streams that is.
    #[pyo3(signature = (type_url, resources, version, packed = false))]
    fn set_resources(&self, py: Python<'_>, type_url: &str, resources: &Bound<'_, PyDict>, version: &str,
                     packed: bool) -> PyResult<usize> {
        check_type(type_url)?;
        let items = extract_items(resources, type_url, packed)?;
        let state = self.state.clone();
        Ok(py.allow_threads(|| {
            let (reached, w) = state.lock().unwrap().set_resources(type_url, items, version.to_string());
            wake(w);
            reached
        }))
    }

    /// Put `put` ({name: bytes}) and remove the names in `remove`, keeping the type's other resources, at
    /// `version`. Returns how many streams it pushes to.
    #[pyo3(signature = (type_url, put, remove = Vec::new(), version = "", packed = false))]
    fn update_resources(&self, py: Python<'_>, type_url: &str, put: &Bound<'_, PyDict>, remove: Vec<String>,
                        version: &str, packed: bool) -> PyResult<usize> {
        check_type(type_url)?;
        if version.is_empty() {
            return Err(PyValueError::new_err("xds engine: update_resources needs a version (a new one per change)"));
        }
        let items = extract_items(put, type_url, packed)?;
        let state = self.state.clone();
        Ok(py.allow_threads(|| {
            let (reached, w) = state.lock().unwrap().update_resources(type_url, items, remove, version.to_string());
            wake(w);
            reached
        }))
    }

    /// The version and names of the resources of `type_url` (None: never set).
    fn resources(&self, py: Python<'_>, type_url: &str) -> Option<(String, Vec<String>)> {
        let state = self.state.clone();
        py.allow_threads(|| {
            let st = state.lock().unwrap();
            st.types.get(type_url).map(|t| (t.version.clone(), t.items.keys().cloned().collect()))
        })
    }

    /// The open streams, for CSDS: per stream its id, peer, node (id, cluster, user agent) and per type URL
    /// the subscribed names, the versions sent and ACKed, the last nonce, the last NACK's error.
    fn streams<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let state = self.state.clone();
        #[allow(clippy::type_complexity)]
        let snapshot: Vec<(u64, [String; 5], u64, Vec<(String, Subscription)>)> = py.allow_threads(|| {
            let st = state.lock().unwrap();
            st.streams.iter().map(|(id, s)| {
                (*id,
                 [s.peer.clone(), s.node_id.clone(), s.cluster.clone(), s.user_agent_name.clone(),
                  s.user_agent_version.clone()],
                 s.responses,
                 s.subs.iter().map(|(t, sub)| (t.clone(), sub.clone())).collect())
            }).collect()
        });
        let out = PyList::empty(py);
        for (id, [peer, node_id, cluster, ua_name, ua_version], responses, subs) in snapshot {
            let d = PyDict::new(py);
            d.set_item("id", id)?;
            d.set_item("peer", peer)?;
            d.set_item("node_id", node_id)?;
            d.set_item("cluster", cluster)?;
            d.set_item("user_agent_name", ua_name)?;
            d.set_item("user_agent_version", ua_version)?;
            d.set_item("responses", responses)?;
            let types = PyDict::new(py);
            for (t, sub) in &subs {
                types.set_item(t, sub_dict(py, sub)?)?;
            }
            d.set_item("types", types)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// End every stream with UNAVAILABLE (clients reconnect elsewhere), stop listening, stop the threads.
    fn stop(&self, py: Python<'_>) {
        let Some(running) = self.running.lock().unwrap().take() else { return };
        let state = self.state.clone();
        py.allow_threads(move || {
            let w = {
                let mut st = state.lock().unwrap();
                st.stopping = true;
                st.wake_all()
            };
            wake(w);
            let _ = running.shutdown.send(());
            std::thread::sleep(Duration::from_millis(50)); // the streams' tasks write their UNAVAILABLE
            running.runtime.shutdown_timeout(Duration::from_secs(2));
        });
    }
}

#[pymodule]
fn waypost_xds_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

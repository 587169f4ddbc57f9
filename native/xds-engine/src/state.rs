//! The engine's state: the resources Python handed over (per type URL: a version and the serialized resources
//! by name) and, per open ADS stream, its node and per type its subscription and ACK/NACK state.
//!
//! One mutex guards both. Every operation under it is short (no I/O, no encoding): a request updates one
//! stream's entry; `set_resources` compares the new resources with the old and, for each stream that subscribes
//! to a changed name, puts the response in the stream's outbox at once (the transport encodes and writes it on
//! tokio's threads) -- or, when that outbox is full (a client reading slowly), marks the type due and wakes the
//! stream's task, which writes the newest state once there is room. Marking instead of queueing keeps state of
//! the world's rule: a stream that is behind gets the newest state once, not every state in between. Every
//! response enters an outbox under the lock, so responses leave in the order of their nonces.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

use crate::proto::{DiscoveryRequest, DiscoveryResponse};

/// Where a stream's responses go: the transport takes them from the other end in order.
pub type Outbox = mpsc::Sender<Result<DiscoveryResponse, tonic::Status>>;

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// Listeners and Clusters are the types whose empty subscription means "all of them" (and whose responses are
/// the whole state: a resource left out of one is deleted).
fn wildcard_type(type_url: &str) -> bool {
    type_url == LISTENER || type_url == CLUSTER
}

/// The resources of one type: the version Python gave them and each one's encoded Any by name.
#[derive(Default)]
pub struct TypeResources {
    pub version: String,
    pub items: BTreeMap<String, Bytes>,
}

/// One stream's subscription to one type and what the client said of the responses.
#[derive(Default, Clone)]
pub struct Subscription {
    /// the names asked for (empty with `wildcard`: every resource of the type)
    pub names: BTreeSet<String>,
    pub wildcard: bool,
    /// version of the last response the client ACKed ("" before the first ACK)
    pub acked_version: String,
    /// nonce of the last response sent; a request carrying another (older) nonce is stale and ignored
    pub last_nonce: String,
    /// version of the last response sent
    pub sent_version: String,
    /// error_detail.message of the last NACK; cleared when a later response is ACKed
    pub nack_error: Option<String>,
    /// version of the response NACKed (the client keeps `acked_version`)
    pub nacked_version: String,
    pub acks: u64,
    pub nacks: u64,
    /// a response of this type is due (set by a request or a change, taken by the stream's task)
    pending: bool,
}

/// One open ADS stream.
pub struct StreamEntry {
    pub peer: String,
    pub node_id: String,
    pub cluster: String,
    pub user_agent_name: String,
    pub user_agent_version: String,
    pub subs: BTreeMap<String, Subscription>,
    pub responses: u64,
    nonce_seq: u64,
    notify: Arc<Notify>,
    outbox: Outbox,
}

#[derive(Default)]
pub struct State {
    pub types: HashMap<String, TypeResources>,
    pub streams: BTreeMap<u64, StreamEntry>,
    next_id: u64,
    /// set by stop(): stream tasks end their streams with UNAVAILABLE
    pub stopping: bool,
}

impl State {
    pub fn register(&mut self, peer: String, notify: Arc<Notify>, outbox: Outbox) -> u64 {
        self.next_id += 1;
        let entry = StreamEntry {
            peer,
            node_id: String::new(),
            cluster: String::new(),
            user_agent_name: String::new(),
            user_agent_version: String::new(),
            subs: BTreeMap::new(),
            responses: 0,
            nonce_seq: 0,
            notify,
            outbox,
        };
        self.streams.insert(self.next_id, entry);
        self.next_id
    }

    pub fn deregister(&mut self, id: u64) {
        self.streams.remove(&id);
    }

    /// Apply one request of stream `id`: its node (the first request carries it), the subscription, an ACK or
    /// NACK of the response whose nonce it carries. Marks a response due when the client has none of this
    /// type yet (no nonce) or asks for names it did not have.
    pub fn on_request(&mut self, id: u64, req: DiscoveryRequest) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if let Some(node) = req.node {
            s.node_id = node.id;
            s.cluster = node.cluster;
            s.user_agent_name = node.user_agent_name;
            s.user_agent_version = node.user_agent_version;
        }
        if req.type_url.is_empty() {
            return; // ADS requires the type; nothing to answer
        }
        let known = self.types.contains_key(&req.type_url);
        let wild_type = wildcard_type(&req.type_url);
        let sub = s.subs.entry(req.type_url).or_default();
        let names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let wildcard = (names.is_empty() && wild_type) || names.contains("*");
        if req.response_nonce.is_empty() {
            // a first request of this type on this stream (or after the client lost its state): always answered
            sub.names = names;
            sub.wildcard = wildcard;
            sub.pending = known;
            return;
        }
        if req.response_nonce != sub.last_nonce {
            return; // stale: answers a response older than the last sent; the client will answer that one too
        }
        match req.error_detail {
            Some(err) => {
                sub.nack_error = Some(err.message);
                sub.nacked_version = sub.sent_version.clone();
                sub.nacks += 1;
            }
            None => {
                sub.acked_version = req.version_info;
                sub.nack_error = None;
                sub.acks += 1;
            }
        }
        let added = names.iter().any(|n| !sub.names.contains(n)) || (wildcard && !sub.wildcard);
        sub.names = names;
        sub.wildcard = wildcard;
        if added && known {
            sub.pending = true;
        }
    }

    /// Replace the resources of `type_url` (the whole set of that type) and push to the streams that subscribe
    /// to a name whose value changed, appeared or went away. Returns how many streams that is, and the tasks to
    /// wake (streams whose response could not go out at once).
    pub fn set_resources(&mut self, type_url: &str, items: BTreeMap<String, Bytes>, version: String)
                         -> (usize, Vec<Arc<Notify>>) {
        let old = self.types.remove(type_url);
        let first = old.is_none();
        let old_items = old.map(|t| t.items).unwrap_or_default();
        let mut changed: HashSet<&str> = HashSet::new();
        for (name, value) in &items {
            if old_items.get(name) != Some(value) {
                changed.insert(name.as_str());
            }
        }
        for name in old_items.keys() {
            if !items.contains_key(name) {
                changed.insert(name.as_str());
            }
        }
        let mut hits = Vec::new();
        if !changed.is_empty() || first {
            for (id, s) in self.streams.iter() {
                let Some(sub) = s.subs.get(type_url) else { continue };
                let hit = sub.last_nonce.is_empty()  // asked before the type had resources: answer now
                    || (sub.wildcard && !changed.is_empty())
                    || sub.names.iter().any(|n| changed.contains(n.as_str()));
                if hit {
                    hits.push(*id);
                }
            }
        }
        drop(changed);
        self.types.insert(type_url.to_string(), TypeResources { version, items });
        let reached = hits.len();
        let mut woken = Vec::new();
        for id in hits {
            if let Some(w) = self.push(id, type_url) {
                woken.push(w);
            }
        }
        (reached, woken)
    }

    /// Send stream `id` the current `type_url` response now if its outbox has room and nothing else is due on
    /// it (the order of nonces); else mark the type due and return the stream's task to wake (None when the
    /// response went out, or the stream is gone).
    fn push(&mut self, id: u64, type_url: &str) -> Option<Arc<Notify>> {
        let s = self.streams.get_mut(&id)?;
        let any_due = s.subs.values().any(|sub| sub.pending);
        if !any_due {
            if let Ok(permit) = s.outbox.clone().try_reserve_owned() {
                let resp = respond(s, &self.types, type_url)?;
                permit.send(Ok(resp));
                return None;
            }
        }
        let sub = s.subs.get_mut(type_url)?;
        if sub.pending {
            return None; // already due, its task already woken
        }
        sub.pending = true;
        Some(s.notify.clone())
    }

    /// Put or remove some resources of `type_url`, keeping the others (a change of one export's endpoints
    /// need not hand over every export's). Same marking as `set_resources`.
    pub fn update_resources(&mut self, type_url: &str, put: BTreeMap<String, Bytes>, remove: Vec<String>,
                            version: String) -> (usize, Vec<Arc<Notify>>) {
        let mut items = self.types.get(type_url).map(|t| t.items.clone()).unwrap_or_default();
        for name in remove {
            items.remove(&name);
        }
        items.extend(put);
        self.set_resources(type_url, items, version)
    }

    /// One response due on stream `id` (a marked type: the subscribed resources as they are now, the type's
    /// version, a new nonce), or None when nothing is due. The caller holds room in the outbox for it.
    pub fn take_pending(&mut self, id: u64) -> Option<DiscoveryResponse> {
        let s = self.streams.get_mut(&id)?;
        loop {
            let type_url = s.subs.iter().find(|(_, sub)| sub.pending).map(|(t, _)| t.clone())?;
            s.subs.get_mut(&type_url)?.pending = false;
            if let Some(resp) = respond(s, &self.types, &type_url) {
                return Some(resp);
            }
        }
    }

    /// Whether stream `id` has a response due.
    pub fn has_pending(&self, id: u64) -> bool {
        self.streams.get(&id).is_some_and(|s| s.subs.values().any(|sub| sub.pending))
    }

    pub fn wake_all(&self) -> Vec<Arc<Notify>> {
        self.streams.values().map(|s| s.notify.clone()).collect()
    }
}

/// The response of `type_url` for stream `s` now (None when the type has no resources yet), recorded as sent.
fn respond(s: &mut StreamEntry, types: &HashMap<String, TypeResources>, type_url: &str)
           -> Option<DiscoveryResponse> {
    let res = types.get(type_url)?;
    let sub = s.subs.get_mut(type_url)?;
    let resources: Vec<Bytes> = if sub.wildcard {
        res.items.values().cloned().collect()
    } else {
        sub.names.iter().filter_map(|n| res.items.get(n)).cloned().collect()
    };
    s.nonce_seq += 1;
    let nonce = s.nonce_seq.to_string();
    sub.last_nonce = nonce.clone();
    sub.sent_version = res.version.clone();
    s.responses += 1;
    Some(DiscoveryResponse { version_info: res.version.clone(), resources, type_url: type_url.to_string(), nonce })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Status;

    const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    type Inbox = mpsc::Receiver<Result<DiscoveryResponse, tonic::Status>>;

    fn req(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn items(pairs: &[(&str, &str)]) -> BTreeMap<String, Bytes> {
        pairs.iter().map(|(k, v)| (k.to_string(), Bytes::from(v.to_string()))).collect()
    }

    fn stream(st: &mut State, room: usize) -> (u64, Inbox) {
        let (tx, rx) = mpsc::channel(room);
        (st.register("p".into(), Arc::new(Notify::new()), tx), rx)
    }

    /// What the stream's task does: the due responses, as they go out.
    fn drain_due(st: &mut State, id: u64) -> Vec<DiscoveryResponse> {
        std::iter::from_fn(|| st.take_pending(id)).collect()
    }

    fn sent(rx: &mut Inbox) -> Vec<DiscoveryResponse> {
        std::iter::from_fn(|| rx.try_recv().ok()).map(|r| r.unwrap()).collect()
    }

    #[test]
    fn subscribe_ack_push_only_changed_names() {
        let mut st = State::default();
        st.set_resources(EDS, items(&[("a", "1"), ("b", "1")]), "1".into());
        let (id, mut rx) = stream(&mut st, 4);
        st.on_request(id, req(EDS, &["a"], "", ""));
        let r = drain_due(&mut st, id);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].resources.len(), 1);
        assert_eq!(r[0].version_info, "1");
        st.on_request(id, req(EDS, &["a"], "1", &r[0].nonce));
        assert_eq!(st.streams[&id].subs[EDS].acked_version, "1");
        // b changes: a's subscriber gets nothing
        st.set_resources(EDS, items(&[("a", "1"), ("b", "2")]), "2".into());
        assert!(sent(&mut rx).is_empty());
        // a changes: pushed at once, version 3
        let (reached, woken) = st.set_resources(EDS, items(&[("a", "2"), ("b", "2")]), "3".into());
        assert_eq!((reached, woken.len()), (1, 0)); // sent at once, no task woken
        let r = sent(&mut rx);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].version_info, "3");
        assert_eq!(st.streams[&id].subs[EDS].last_nonce, r[0].nonce);
    }

    #[test]
    fn a_full_outbox_gets_the_newest_state_once() {
        let mut st = State::default();
        st.set_resources(EDS, items(&[("a", "1")]), "1".into());
        let (id, mut rx) = stream(&mut st, 1);
        st.on_request(id, req(EDS, &["a"], "", ""));
        let first = drain_due(&mut st, id);
        st.on_request(id, req(EDS, &["a"], "1", &first[0].nonce));
        st.set_resources(EDS, items(&[("a", "2")]), "2".into()); // fills the outbox
        assert_eq!(st.set_resources(EDS, items(&[("a", "3")]), "3".into()).1.len(), 1); // due: task woken
        let (reached, woken) = st.set_resources(EDS, items(&[("a", "4")]), "4".into());
        assert_eq!((reached, woken.len()), (1, 0)); // still due: not woken again
        assert_eq!(sent(&mut rx)[0].version_info, "2");
        let due = drain_due(&mut st, id);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].version_info, "4");
    }

    #[test]
    fn nack_keeps_acked_version_and_stale_nonce_is_ignored() {
        let mut st = State::default();
        st.set_resources(EDS, items(&[("a", "1")]), "1".into());
        let (id, mut rx) = stream(&mut st, 4);
        st.on_request(id, req(EDS, &["a"], "", ""));
        let n1 = drain_due(&mut st, id)[0].nonce.clone();
        st.on_request(id, req(EDS, &["a"], "1", &n1));
        st.set_resources(EDS, items(&[("a", "2")]), "2".into());
        let n2 = sent(&mut rx)[0].nonce.clone();
        let mut nack = req(EDS, &["a"], "1", &n2);
        nack.error_detail = Some(Status { code: 3, message: "bad".into() });
        st.on_request(id, nack);
        let sub = &st.streams[&id].subs[EDS];
        assert_eq!(sub.acked_version, "1");
        assert_eq!(sub.nack_error.as_deref(), Some("bad"));
        assert_eq!(sub.nacked_version, "2");
        // a stale request (old nonce) with new names changes nothing
        st.on_request(id, req(EDS, &["a", "b"], "1", &n1));
        assert_eq!(st.streams[&id].subs[EDS].names.len(), 1);
    }

    #[test]
    fn wildcard_listener_and_late_type() {
        let mut st = State::default();
        let (id, mut rx) = stream(&mut st, 4);
        st.on_request(id, req(LISTENER, &[], "", ""));
        assert!(drain_due(&mut st, id).is_empty()); // no listeners yet: nothing to say
        st.set_resources(LISTENER, items(&[("x", "1"), ("y", "1")]), "1".into());
        let r = sent(&mut rx);
        assert_eq!(r[0].resources.len(), 2);
        st.on_request(id, req(LISTENER, &[], "1", &r[0].nonce));
        // removing one is a change of the whole state
        st.set_resources(LISTENER, items(&[("x", "1")]), "2".into());
        assert_eq!(sent(&mut rx)[0].resources.len(), 1);
    }
}

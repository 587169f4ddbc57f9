//! The few xDS messages the engine reads and writes, declared by hand with the field numbers of
//! envoy/service/discovery/v3/discovery.proto, envoy/config/core/v3/base.proto (Node),
//! google/protobuf/any.proto and google/rpc/status.proto. Fields the engine does not use are left out:
//! protobuf skips unknown fields on decode, so a client sending them (metadata, locality, ...) is read as usual.

use bytes::Bytes;

/// google.protobuf.Any: a resource is wrapped in one once, when Python hands it over (`pack`); responses carry
/// the encoded bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// google.rpc.Status: a NACK's error_detail (its `details` are not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// envoy.config.core.v3.Node: what CSDS shows of a client. `user_agent_version` is one arm of the
/// `user_agent_version_type` oneof; a plain string field is the same on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub cluster: String,
    #[prost(string, tag = "6")]
    pub user_agent_name: String,
    #[prost(string, tag = "7")]
    pub user_agent_version: String,
}

/// envoy.service.discovery.v3.DiscoveryRequest
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryRequest {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    #[prost(string, repeated, tag = "3")]
    pub resource_names: Vec<String>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

/// envoy.service.discovery.v3.DiscoveryResponse
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// each an encoded google.protobuf.Any: a repeated message field and a repeated bytes field are the same on
    /// the wire, so a resource is encoded once and shared (not copied) by every response that carries it
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// The encoded Any of a resource's serialized `value`.
pub fn pack(type_url: &str, value: Bytes) -> Bytes {
    use prost::Message;
    Bytes::from(Any { type_url: type_url.to_string(), value }.encode_to_vec())
}

/// Whether `data` is an encoded Any of `type_url` (what `set_resources(..., packed=True)` takes).
pub fn is_any_of(data: &[u8], type_url: &str) -> bool {
    use prost::Message;
    Any::decode(data).is_ok_and(|a| a.type_url == type_url)
}

//! Parser for `system_profiler SPThunderboltDataType -json`: one [`Bus`] per Thunderbolt bus
//! (one bus per physical port), with the port number, link state and speed, and the other Macs
//! cabled to it.
//!
//! The shape follows the field names recorded in the MLX notes: the top-level key
//! `SPThunderboltDataType` holds a list of buses; each has `_name`, `domain_uuid_key` and a
//! `receptacle_1_tag` object (`receptacle_id_key`, `receptacle_status_key`, `current_speed_key`),
//! and `_items` lists the devices on the cable. An item with a `domain_uuid_key` is another Mac
//! and that uuid names the far end's bus; items without one (docks, drives) are skipped.
//!
//! Pure: takes the command's output as a string, does no I/O.

use serde_json::{Map, Value};

/// The top-level key of the `system_profiler` document.
const ROOT_KEY: &str = "SPThunderboltDataType";
/// `receptacle_status_key` value of a port with a cable and a device on it.
const CONNECTED: &str = "receptacle_connected";

/// One Thunderbolt bus of this Mac (one physical port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bus {
    /// The bus's `_name`, e.g. `thunderboltusb4_bus_0`.
    pub name: String,
    /// The bus's `domain_uuid_key`; peers name this bus by it.
    pub domain_uuid: String,
    /// The port number N (`receptacle_1_tag.receptacle_id_key`), paired with "Thunderbolt N".
    pub receptacle: Option<u32>,
    /// Whether `receptacle_status_key` is `receptacle_connected`.
    pub connected: bool,
    /// Link speed in Gb/s from `current_speed_key` ("Up to 80 Gb/s", "40 Gb/s", ...).
    pub speed_gbps: Option<u32>,
    /// Other Macs on this bus's cable.
    pub peers: Vec<Peer>,
}

/// Another Mac cabled to a [`Bus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The item's `_name` (or `device_name_key` when `_name` is absent), e.g. `Mac Studio`.
    pub name: String,
    /// The `domain_uuid_key` of the far end's bus.
    pub domain_uuid: String,
}

/// Why `system_profiler SPThunderboltDataType -json` output could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum ThunderboltError {
    /// The text is not JSON at all.
    #[error("expected a JSON document from system_profiler: {0}")]
    Json(#[from] serde_json::Error),
    /// The document lacks the top-level list.
    #[error("expected a top-level object with an `SPThunderboltDataType` array")]
    MissingRoot,
    /// A bus entry is not an object.
    #[error("expected bus #{index} of `SPThunderboltDataType` to be an object")]
    BusNotObject {
        /// Position of the bus in the list.
        index: usize,
    },
    /// A required string field is missing or not a string.
    #[error("expected `{field}` to be a string in {context}")]
    MissingString {
        /// The JSON key.
        field: &'static str,
        /// Which bus or item it was expected in.
        context: String,
    },
    /// `receptacle_1_tag` is present but not an object.
    #[error("expected `receptacle_1_tag` to be an object in bus `{bus}`")]
    ReceptacleNotObject {
        /// The bus's `_name`.
        bus: String,
    },
    /// `receptacle_id_key` is not a non-negative integer.
    #[error("expected `receptacle_id_key` to be a port number in bus `{bus}`, found {found}")]
    BadReceptacleId {
        /// The bus's `_name`.
        bus: String,
        /// The value found.
        found: String,
    },
    /// `_items` is present but not a list of objects.
    #[error("expected `_items` to be an array of objects in bus `{bus}`")]
    BadItems {
        /// The bus's `_name`.
        bus: String,
    },
}

/// Parses the output of `system_profiler SPThunderboltDataType -json` into its buses, in the
/// order listed.
pub fn parse_buses(json: &str) -> Result<Vec<Bus>, ThunderboltError> {
    let doc: Value = serde_json::from_str(json)?;
    let list = doc
        .get(ROOT_KEY)
        .and_then(Value::as_array)
        .ok_or(ThunderboltError::MissingRoot)?;
    list.iter()
        .enumerate()
        .map(|(index, entry)| {
            let obj = entry
                .as_object()
                .ok_or(ThunderboltError::BusNotObject { index })?;
            parse_bus(index, obj)
        })
        .collect()
}

fn parse_bus(index: usize, obj: &Map<String, Value>) -> Result<Bus, ThunderboltError> {
    let name = string_field(obj, "_name", || format!("bus #{index}"))?;
    let domain_uuid = string_field(obj, "domain_uuid_key", || format!("bus `{name}`"))?;

    let (receptacle, connected, speed_gbps) =
        match obj.get("receptacle_1_tag") {
            None => (None, false, None),
            Some(tag) => {
                let tag = tag
                    .as_object()
                    .ok_or_else(|| ThunderboltError::ReceptacleNotObject { bus: name.clone() })?;
                let receptacle = tag
                    .get("receptacle_id_key")
                    .map(|v| receptacle_id(&name, v))
                    .transpose()?;
                let connected =
                    tag.get("receptacle_status_key").and_then(Value::as_str) == Some(CONNECTED);
                let speed_gbps = tag.get("current_speed_key").and_then(Value::as_str).and_then(|s| {
                let speed = parse_speed_gbps(s);
                if speed.is_none() {
                    tracing::debug!(bus = %name, speed = s, "unrecognised Thunderbolt speed");
                }
                speed
            });
                (receptacle, connected, speed_gbps)
            }
        };

    let peers = match obj.get("_items") {
        None => Vec::new(),
        Some(items) => {
            let items = items
                .as_array()
                .ok_or_else(|| ThunderboltError::BadItems { bus: name.clone() })?;
            let mut peers = Vec::new();
            for item in items {
                let item = item
                    .as_object()
                    .ok_or_else(|| ThunderboltError::BadItems { bus: name.clone() })?;
                if let Some(peer) = parse_peer(&name, item)? {
                    peers.push(peer);
                }
            }
            peers
        }
    };

    Ok(Bus {
        name,
        domain_uuid,
        receptacle,
        connected,
        speed_gbps,
        peers,
    })
}

/// An item is a Mac when it carries a `domain_uuid_key`; anything else yields `None`.
fn parse_peer(bus: &str, item: &Map<String, Value>) -> Result<Option<Peer>, ThunderboltError> {
    let Some(uuid) = item.get("domain_uuid_key") else {
        return Ok(None);
    };
    let context = || format!("an item of bus `{bus}`");
    let domain_uuid = uuid
        .as_str()
        .ok_or_else(|| ThunderboltError::MissingString {
            field: "domain_uuid_key",
            context: context(),
        })?
        .to_owned();
    let name = item
        .get("_name")
        .or_else(|| item.get("device_name_key"))
        .and_then(Value::as_str)
        .ok_or_else(|| ThunderboltError::MissingString {
            field: "_name",
            context: context(),
        })?
        .to_owned();
    Ok(Some(Peer { name, domain_uuid }))
}

fn string_field(
    obj: &Map<String, Value>,
    field: &'static str,
    context: impl FnOnce() -> String,
) -> Result<String, ThunderboltError> {
    obj.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ThunderboltError::MissingString {
            field,
            context: context(),
        })
}

/// `receptacle_id_key` is a string ("3") in the recorded shape; a bare number is accepted too.
fn receptacle_id(bus: &str, value: &Value) -> Result<u32, ThunderboltError> {
    let parsed = match value {
        Value::String(s) => s.trim().parse::<u32>().ok(),
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        _ => None,
    };
    parsed.ok_or_else(|| ThunderboltError::BadReceptacleId {
        bus: bus.to_owned(),
        found: value.to_string(),
    })
}

/// Reads a speed such as "Up to 120 Gb/s", "80 Gb/s" or "40 Gb/s" as whole Gb/s; `None` when
/// the text has no `<number> Gb/s`.
pub fn parse_speed_gbps(text: &str) -> Option<u32> {
    let lower = text.to_ascii_lowercase();
    let before = lower
        .split("gb/s")
        .next()
        .filter(|_| lower.contains("gb/s"))?;
    before.split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESH: &str =
        include_str!("../../tests/fixtures/discovery/mesh_member/sp_thunderbolt.json");
    const SAME_PEER: &str =
        include_str!("../../tests/fixtures/discovery/same_peer_twice/sp_thunderbolt.json");
    const CHAIN: &str =
        include_str!("../../tests/fixtures/discovery/chain_middle/sp_thunderbolt.json");
    const NO_CABLES: &str =
        include_str!("../../tests/fixtures/discovery/no_cables/sp_thunderbolt.json");
    const RDMA_OFF: &str =
        include_str!("../../tests/fixtures/discovery/rdma_disabled/sp_thunderbolt.json");

    #[test]
    fn mesh_member_has_three_peers_on_three_ports() {
        let buses = parse_buses(MESH).expect("fixture parses");
        assert_eq!(buses.len(), 4);
        let first = &buses[0];
        assert_eq!(first.name, "thunderboltusb4_bus_0");
        assert_eq!(first.domain_uuid, "6C1E2F7A-0000-4000-8000-000000000001");
        assert_eq!(first.receptacle, Some(1));
        assert!(first.connected);
        assert_eq!(first.speed_gbps, Some(80));
        assert_eq!(
            first.peers,
            vec![Peer {
                name: "Mac Studio".into(),
                domain_uuid: "9A3B4C5D-0000-4000-8000-000000000001".into()
            }]
        );
        assert_eq!(buses[1].speed_gbps, Some(80));
        assert_eq!(buses[2].speed_gbps, Some(120));
        let peers: Vec<_> = buses
            .iter()
            .flat_map(|b| &b.peers)
            .map(|p| &p.domain_uuid)
            .collect();
        assert_eq!(peers.len(), 3);
        let last = &buses[3];
        assert_eq!(last.receptacle, Some(4));
        assert!(!last.connected);
        assert_eq!(last.speed_gbps, None);
        assert!(last.peers.is_empty());
    }

    #[test]
    fn two_cables_to_the_same_peer() {
        let buses = parse_buses(SAME_PEER).expect("fixture parses");
        assert_eq!(buses[0].peers, buses[1].peers);
        assert_ne!(buses[0].domain_uuid, buses[1].domain_uuid);
    }

    #[test]
    fn chain_middle_skips_non_mac_items() {
        let buses = parse_buses(CHAIN).expect("fixture parses");
        let with_peers: Vec<_> = buses
            .iter()
            .filter(|b| !b.peers.is_empty())
            .map(|b| b.receptacle)
            .collect();
        assert_eq!(with_peers, vec![Some(1), Some(3)]);
        assert!(
            buses[1].connected,
            "the dock's port is connected but has no Mac"
        );
    }

    #[test]
    fn no_cables_and_tb4_speed() {
        let buses = parse_buses(NO_CABLES).expect("fixture parses");
        assert_eq!(buses.len(), 3);
        assert!(buses.iter().all(|b| !b.connected && b.peers.is_empty()));
        let buses = parse_buses(RDMA_OFF).expect("fixture parses");
        assert_eq!(buses[0].speed_gbps, Some(40));
    }

    #[test]
    fn speeds() {
        assert_eq!(parse_speed_gbps("Up to 80 Gb/s"), Some(80));
        assert_eq!(parse_speed_gbps("Up to 120 Gb/s"), Some(120));
        assert_eq!(parse_speed_gbps("80 Gb/s"), Some(80));
        assert_eq!(parse_speed_gbps("40 Gb/s"), Some(40));
        assert_eq!(parse_speed_gbps("fast"), None);
        assert_eq!(parse_speed_gbps("Gb/s"), None);
    }

    #[test]
    fn numeric_receptacle_and_missing_tag() {
        let json = r#"{"SPThunderboltDataType":[
            {"_name":"b0","domain_uuid_key":"U0","receptacle_1_tag":{"receptacle_id_key":2}},
            {"_name":"b1","domain_uuid_key":"U1"}]}"#;
        let buses = parse_buses(json).expect("parses");
        assert_eq!(buses[0].receptacle, Some(2));
        assert_eq!(buses[1].receptacle, None);
        assert!(!buses[1].connected);
    }

    #[test]
    fn malformed_input_is_rejected_with_what_was_expected() {
        let err = parse_buses("not json").expect_err("not JSON");
        assert!(matches!(err, ThunderboltError::Json(_)));
        let err = parse_buses(r#"{"SPUSBDataType":[]}"#).expect_err("wrong root");
        assert!(matches!(err, ThunderboltError::MissingRoot));
        assert!(err.to_string().contains("SPThunderboltDataType"));
        let err = parse_buses(r#"{"SPThunderboltDataType":[1]}"#).expect_err("bus not object");
        assert!(matches!(err, ThunderboltError::BusNotObject { index: 0 }));
        let err =
            parse_buses(r#"{"SPThunderboltDataType":[{"_name":"b0"}]}"#).expect_err("no uuid");
        assert!(err.to_string().contains("domain_uuid_key"), "{err}");
        let err = parse_buses(
            r#"{"SPThunderboltDataType":[{"_name":"b0","domain_uuid_key":"U","receptacle_1_tag":{"receptacle_id_key":"left"}}]}"#,
        )
        .expect_err("bad receptacle");
        assert!(matches!(err, ThunderboltError::BadReceptacleId { .. }));
        assert!(err.to_string().contains("\"left\""), "{err}");
        let err = parse_buses(
            r#"{"SPThunderboltDataType":[{"_name":"b0","domain_uuid_key":"U","receptacle_1_tag":"3"}]}"#,
        )
        .expect_err("tag not object");
        assert!(matches!(err, ThunderboltError::ReceptacleNotObject { .. }));
        let err = parse_buses(
            r#"{"SPThunderboltDataType":[{"_name":"b0","domain_uuid_key":"U","_items":{}}]}"#,
        )
        .expect_err("items not array");
        assert!(matches!(err, ThunderboltError::BadItems { .. }));
        let err = parse_buses(
            r#"{"SPThunderboltDataType":[{"_name":"b0","domain_uuid_key":"U","_items":[{"domain_uuid_key":7}]}]}"#,
        )
        .expect_err("peer uuid not string");
        assert!(err.to_string().contains("domain_uuid_key"), "{err}");
    }
}

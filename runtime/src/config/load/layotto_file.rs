//! Layotto's own configuration files: a MOSN configuration whose gRPC
//! filter carries `grpc_config`, an object of kind -> name -> component
//! (Layotto's `configs/*.json`). The first `grpc_config` found under
//! `servers[].listeners[].filter_chains[].filters[].config` is turned into
//! rewire's form, so it loads, validates and reloads as any rewire file.
//!
//! Layotto's spellings are kept where rewire reads them already
//! (`component_ref`, `secret_ref`, `inject_as`); what differs is mapped:
//! a component without `type` is of the type its name says, `in-memory` is
//! `memory`, `local.env` is `env`, and a `secret_ref` names its store with
//! `name`; a config store's connection, which Layotto's `StoreConfig`
//! keeps at the component's top level (`address`, `timeout`, `store_name`,
//! `app_id`), goes into its metadata (see [`store_config`]), and the block
//! may be spelled `config_stores`. A sequencer's `biggerThan`, which Layotto
//! keeps beside `metadata`, goes into it (key by key, the larger value
//! kept), and Layotto's etcd sequencer metadata is read as Layotto reads
//! it (see [`sequencer_config`]).
//! `hellos` and `app.grpc_callback_port` are dropped with a note,
//! and so are MOSN's top-level settings other than `servers` (`tracing`,
//! `metrics`, `pprof`: the MOSN process's, not components); every other
//! unsupported building block is a problem naming it, and so is a second
//! `grpc_config` (its components would not be loaded).

use serde_json::{Map, Value};

use crate::problem::Problem;

/// Layotto's building blocks rewire serves, with rewire's kind for each.
const KINDS: &[(&str, &str)] = &[
    ("config_store", "config_store"),
    // Layotto's published files (`configs/config_apollo.json`) spell it so.
    ("config_stores", "config_store"),
    ("state", "state"),
    ("lock", "lock"),
    ("sequencer", "sequencer"),
    ("pub_subs", "pubsub"),
    ("secret_store", "secret_store"),
    ("file", "file"),
];

/// Layotto type names whose rewire type is spelled otherwise.
const TYPES: &[(&str, &str)] = &[("in-memory", "memory"), ("local.env", "env")];

/// A Layotto file turned into rewire's form, with what could not be.
#[derive(Debug, Default)]
pub(crate) struct Converted {
    /// The document in rewire's form (`appId`, `components`).
    pub document: Map<String, Value>,
    /// What is not supported, each naming where it is.
    pub problems: Vec<Problem>,
    /// What was left out on purpose.
    pub notes: Vec<String>,
}

/// Whether `document` is a Layotto (MOSN) configuration rather than
/// rewire's own: it has `servers` and no `components`.
pub(crate) fn is_layotto(document: &Map<String, Value>) -> bool {
    document.contains_key("servers") && !document.contains_key("components")
}

/// The rewire form of the Layotto configuration `document`; a problem when
/// it has no `grpc_config`.
pub(crate) fn convert(document: &Map<String, Value>) -> Result<Converted, Problem> {
    let mut found = find_grpc_configs(document).into_iter();
    let (at, grpc_config) = found.next().ok_or_else(|| {
        Problem::file(
            "a Layotto (MOSN) configuration without `grpc_config`: expected one under \
             servers[].listeners[].filter_chains[].filters[].config",
        )
    })?;
    let mut converted = Converted::default();
    for (other, _) in found {
        converted.problems.push(Problem::file(format!(
            "{other}: a second `grpc_config` is not supported by rewire: only the first ({at}) \
             is loaded; move its components there"
        )));
    }
    for key in document.keys().filter(|key| *key != "servers") {
        converted.notes.push(format!(
            "`{}`: a MOSN setting rewire does not read; left out",
            key.escape_debug()
        ));
    }
    let mut components = Map::new();
    for (block, value) in grpc_config {
        let here = format!("{at}.{block}");
        match block.as_str() {
            "app" => app(&here, value, &mut converted),
            "hellos" => converted
                .notes
                .push(format!("{here}: Layotto's hello components are not part of rewire; left out")),
            _ => match KINDS.iter().find(|(layotto, _)| layotto == block) {
                Some((_, kind)) => match value {
                    Value::Object(named) => {
                        let entry = components
                            .entry((*kind).to_string())
                            .or_insert_with(|| Value::Object(Map::new()));
                        if let Value::Object(entry) = entry {
                            for (name, spec) in named {
                                let spec = component(&here, kind, name, spec, &mut converted);
                                if entry.insert(name.clone(), spec).is_some() {
                                    converted.problems.push(Problem::file(format!(
                                        "{here}.{name}: `{kind}/{name}` is declared twice (the block has two spellings); keep one"
                                    )));
                                }
                            }
                        }
                    }
                    _ => converted.problems.push(Problem::file(format!(
                        "{here}: must be an object of name -> component"
                    ))),
                },
                None => converted.problems.push(Problem::file(format!(
                    "{here}: Layotto building block `{block}` is not supported by rewire (supported: {})",
                    supported()
                ))),
            },
        }
    }
    converted
        .document
        .insert("components".into(), Value::Object(components));
    Ok(converted)
}

fn supported() -> String {
    let mut names: Vec<&str> = KINDS.iter().map(|(layotto, _)| *layotto).collect();
    names.extend(["app", "hellos (left out)"]);
    names.join(", ")
}

/// Every `grpc_config` object, with where it was found, in document order.
fn find_grpc_configs(document: &Map<String, Value>) -> Vec<(String, &Map<String, Value>)> {
    fn array(value: Option<&Value>) -> &[Value] {
        value.and_then(Value::as_array).map_or(&[], Vec::as_slice)
    }
    let mut found = Vec::new();
    for (s, server) in array(document.get("servers")).iter().enumerate() {
        for (l, listener) in array(server.get("listeners")).iter().enumerate() {
            for (c, chain) in array(listener.get("filter_chains")).iter().enumerate() {
                for (f, filter) in array(chain.get("filters")).iter().enumerate() {
                    if let Some(grpc_config) = filter
                        .pointer("/config/grpc_config")
                        .and_then(Value::as_object)
                    {
                        let at = format!(
                            "servers[{s}].listeners[{l}].filter_chains[{c}].filters[{f}].config.grpc_config"
                        );
                        found.push((at, grpc_config));
                    }
                }
            }
        }
    }
    found
}

/// `app`: its `app_id` is the app id; the callback port is rewire's
/// `--app-port`, not a file setting.
fn app(here: &str, value: &Value, converted: &mut Converted) {
    let Some(app) = value.as_object() else {
        converted
            .problems
            .push(Problem::file(format!("{here}: must be an object")));
        return;
    };
    for (field, value) in app {
        match (field.as_str(), value) {
            ("app_id", Value::String(id)) => {
                converted.document.insert("appId".into(), Value::String(id.clone()));
            }
            ("app_id", _) => converted
                .problems
                .push(Problem::file(format!("{here}.app_id: must be a string"))),
            ("grpc_callback_port", _) => converted.notes.push(format!(
                "{here}.grpc_callback_port: left out (the app's callback port is `rewire run --app-port`)"
            )),
            _ => converted.problems.push(Problem::file(format!(
                "{here}.{field}: unknown field (rewire reads `app_id`)"
            ))),
        }
    }
}

/// One component in rewire's form.
fn component(here: &str, kind: &str, name: &str, spec: &Value, converted: &mut Converted) -> Value {
    let Some(spec) = spec.as_object() else {
        converted
            .problems
            .push(Problem::file(format!("{here}.{name}: must be an object")));
        return Value::Object(Map::new());
    };
    let mut out = spec.clone();
    let type_name = spec.get("type").and_then(Value::as_str).unwrap_or(name);
    let type_name = TYPES
        .iter()
        .find(|(layotto, _)| *layotto == type_name)
        .map_or(type_name, |(_, rewire)| *rewire);
    out.insert("type".into(), Value::String(type_name.to_string()));
    if kind == "config_store" {
        store_config(
            &format!("{here}.{name}"),
            name,
            type_name,
            &mut out,
            converted,
        );
    }
    if kind == "sequencer" {
        sequencer_config(&format!("{here}.{name}"), type_name, &mut out, converted);
    }
    if let Some(Value::Array(refs)) = out.get_mut("secret_ref") {
        for secret_ref in refs.iter_mut().filter_map(Value::as_object_mut) {
            // Layotto's files name the store `name` (`{"name": "local.file",
            // "key": "redisPassword"}`): rewire's Layotto spelling is
            // `store_name`.
            let named_store =
                !secret_ref.contains_key("store_name") && !secret_ref.contains_key("store");
            if named_store {
                if let Some(store) = secret_ref.remove("name") {
                    secret_ref.insert("store_name".into(), store);
                }
            }
        }
    }
    Value::Object(out)
}

/// Layotto's `StoreConfig` fields at a config store's top level, moved
/// where rewire's stores read them: `address` is `apollo`'s `config_server`
/// and `etcd`'s `endpoints` (a list joined with commas); `timeout` (whole
/// seconds, Layotto's etcd dial timeout) is `etcd`'s `dialTimeout`;
/// `app_id` is `apollo`'s `app_id`. A metadata field already set wins;
/// what a type does not take, and `store_name` (the store is named by its
/// key), is left out with a note.
fn store_config(
    here: &str,
    name: &str,
    type_name: &str,
    spec: &mut Map<String, Value>,
    converted: &mut Converted,
) {
    let fields = ["address", "timeout", "store_name", "app_id"];
    if !fields.iter().any(|field| spec.contains_key(*field)) {
        return;
    }
    let mut metadata = match spec.remove("metadata") {
        Some(Value::Object(metadata)) => metadata,
        None | Some(Value::Null) => Map::new(),
        Some(other) => {
            // Left for the component's own check to refuse.
            spec.insert("metadata".into(), other);
            return;
        }
    };
    for field in fields {
        let Some(value) = spec.remove(field) else {
            continue;
        };
        let target = match (type_name, field) {
            ("apollo", "address") => Some(("config_server", joined(&value))),
            ("etcd", "address") => Some(("endpoints", joined(&value))),
            ("etcd", "timeout") => Some(("dialTimeout", seconds(&value))),
            ("apollo", "app_id") => Some(("app_id", value.as_str().map(str::to_string))),
            _ => None,
        };
        let note = match target {
            Some((to, _)) if already(&metadata, to) => {
                format!("{here}.{field}: left out (the metadata sets `{to}`)")
            }
            Some((to, Some(text))) => {
                metadata.insert(to.into(), Value::String(text));
                continue;
            }
            Some((to, None)) => {
                format!("{here}.{field}: left out ({value} is not what `{to}` takes)")
            }
            None if field == "store_name" => {
                format!("{here}.store_name: left out (the store is named by its key, `{name}`)")
            }
            None => format!("{here}.{field}: left out (`{type_name}` does not take it)"),
        };
        converted.notes.push(note);
    }
    spec.insert("metadata".into(), Value::Object(metadata));
}

/// Layotto's sequencer `Config`, in rewire's form: `biggerThan`, beside
/// `metadata` in Layotto's, moves into it (merged key by key with one the
/// metadata sets, the larger value kept: see [`merge_bigger_than`]); the
/// metadata's `segmentCacheEnable` and `segmentStep` (Layotto's shipped
/// `config_sequencer_etcd.json` has them; rewire's sequencers keep no
/// segment cache) are left out with a note.
/// For `etcd`, as Layotto's `ParseEtcdMetadata` reads them: a bare
/// `dialTimeout` (`"5"`) is whole seconds (rewire reads a bare number as
/// milliseconds), `endpoints` are `;`-separated (rewire's: commas), and
/// `tlsCa`, `tlsCert`, `tlsCertKey` are `caCert`, `clientCert`,
/// `clientKey`.
fn sequencer_config(
    here: &str,
    type_name: &str,
    spec: &mut Map<String, Value>,
    converted: &mut Converted,
) {
    let bigger_than = spec.remove("biggerThan");
    let segment_fields = ["segmentCacheEnable", "segmentStep"];
    let has_segment_fields = spec
        .get("metadata")
        .and_then(Value::as_object)
        .is_some_and(|m| segment_fields.iter().any(|f| m.contains_key(*f)));
    if bigger_than.is_none() && !has_segment_fields && type_name != "etcd" {
        return;
    }
    let mut metadata = match spec.remove("metadata") {
        Some(Value::Object(metadata)) => metadata,
        None | Some(Value::Null) => Map::new(),
        Some(other) => {
            // Left for the component's own check to refuse.
            spec.insert("metadata".into(), other);
            if let Some(bigger_than) = bigger_than {
                spec.insert("biggerThan".into(), bigger_than);
            }
            return;
        }
    };
    if let Some(bigger_than) = bigger_than {
        merge_bigger_than(here, &mut metadata, bigger_than, converted);
    }
    for field in segment_fields {
        if let Some(value) = metadata.remove(field) {
            converted.notes.push(format!(
                "{here}.metadata.{field}: left out ({value}; rewire's sequencers keep no \
                 segment cache: every id comes from the backend)"
            ));
        }
    }
    if type_name == "etcd" {
        let bare = match metadata.get("dialTimeout") {
            Some(Value::String(text)) => {
                let text = text.trim();
                (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| text.to_string())
            }
            Some(Value::Number(number)) => number.as_u64().map(|n| n.to_string()),
            _ => None,
        };
        if let Some(seconds) = bare {
            metadata.insert("dialTimeout".into(), Value::String(format!("{seconds}s")));
        }
        if let Some(Value::String(endpoints)) = metadata.get_mut("endpoints") {
            if endpoints.contains(';') {
                *endpoints = endpoints.replace(';', ",");
            }
        }
        for (layotto, rewire) in [
            ("tlsCa", "caCert"),
            ("tlsCert", "clientCert"),
            ("tlsCertKey", "clientKey"),
        ] {
            let Some(value) = metadata.remove(layotto) else {
                continue;
            };
            if metadata.contains_key(rewire) {
                converted.notes.push(format!(
                    "{here}.metadata.{layotto}: left out (the metadata sets `{rewire}`)"
                ));
            } else {
                metadata.insert(rewire.into(), value);
            }
        }
    }
    spec.insert("metadata".into(), Value::Object(metadata));
}

/// Merges a sequencer's top-level `biggerThan` (the one Layotto reads)
/// into the metadata's, key by key: a key only one sets is kept, and a key
/// both set takes the larger value, with a note. A value that is not a
/// whole number wins, so that the sequencer refuses it as Layotto does; a
/// `biggerThan` that is not an object on either side leaves the metadata's
/// as it is, with a note.
fn merge_bigger_than(
    here: &str,
    metadata: &mut Map<String, Value>,
    top: Value,
    converted: &mut Converted,
) {
    let (own, top) = match (metadata.get_mut("biggerThan"), top) {
        (None, top) => {
            metadata.insert("biggerThan".into(), top);
            return;
        }
        (Some(Value::Object(own)), Value::Object(top)) => (own, top),
        (Some(_), _) => {
            converted.notes.push(format!(
                "{here}.biggerThan: left out (the metadata sets `biggerThan`, and one of \
                 the two is not an object)"
            ));
            return;
        }
    };
    for (key, value) in top {
        let Some(mine) = own.get(&key).cloned() else {
            own.insert(key, value);
            continue;
        };
        let note = match (value.as_i64(), mine.as_i64()) {
            (Some(a), Some(b)) => {
                let larger = a.max(b);
                own.insert(key.clone(), Value::from(larger));
                format!(
                    "{here}.biggerThan.{key}: {value} and the metadata's {mine}; the larger, \
                     {larger}, is kept"
                )
            }
            (None, _) => {
                let note = format!(
                    "{here}.biggerThan.{key}: {value} (not a whole number) is kept over the \
                     metadata's {mine}"
                );
                own.insert(key, value);
                note
            }
            (Some(_), None) => {
                format!("{here}.biggerThan.{key}: {value} left out (the metadata's {mine} is kept)")
            }
        };
        converted.notes.push(note);
    }
}

/// Whether `metadata` sets `field` (`apollo`'s `config_server` may be
/// spelled `address`).
fn already(metadata: &Map<String, Value>, field: &str) -> bool {
    metadata.contains_key(field) || (field == "config_server" && metadata.contains_key("address"))
}

/// Layotto's `timeout`: whole seconds, as text (or a number).
fn seconds(value: &Value) -> Option<String> {
    let seconds = match value {
        Value::String(text) => text.trim().parse::<u64>().ok()?,
        other => other.as_u64()?,
    };
    Some(format!("{seconds}s"))
}

/// A string, or a list of them joined with commas.
fn joined(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Array(list) => list
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(|list| list.join(",")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mosn(grpc_config: Value) -> Map<String, Value> {
        let document = serde_json::json!({"servers": [{"listeners": [
            {"name": "actuator", "filter_chains": [{"filters": [{"type": "proxy", "config": {}}]}]},
            {"name": "grpc", "filter_chains": [{"filters": [{"type": "grpc", "config": {
                "server_name": "runtime", "grpc_config": grpc_config}}]}]}
        ]}]});
        document.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_grpc_config_becomes_rewire_components() {
        let document = mosn(serde_json::json!({
            "hellos": {"helloworld": {"hello": "greeting"}},
            "state": {"in-memory": {"metadata": {}}},
            "secret_store": {"local.file": {"type": "local.file", "metadata": {"secretsFile": "s.json"}},
                             "local.env": {"type": "local.env", "metadata": {}}},
            "sequencer": {"redis": {"metadata": {"redisHost": "127.0.0.1:6380"},
                                    "secret_ref": [{"name": "local.file", "key": "redisPassword"}]}},
            "app": {"app_id": "app1", "grpc_callback_port": 9999}
        }));
        assert!(is_layotto(&document));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        assert!(converted.problems.is_empty(), "{:?}", converted.problems);
        assert_eq!(converted.notes.len(), 2, "{:?}", converted.notes);
        assert!(
            converted.notes[0].contains("listeners[1]"),
            "{:?}",
            converted.notes
        );
        let doc = Value::Object(converted.document);
        assert_eq!(doc["appId"], "app1");
        assert_eq!(doc["components"]["state"]["in-memory"]["type"], "memory");
        assert_eq!(
            doc["components"]["secret_store"]["local.env"]["type"],
            "env"
        );
        assert_eq!(
            doc["components"]["secret_store"]["local.file"]["type"],
            "local.file"
        );
        let sequencer = &doc["components"]["sequencer"]["redis"];
        assert_eq!(sequencer["type"], "redis");
        assert_eq!(sequencer["secret_ref"][0]["store_name"], "local.file");
        assert_eq!(sequencer["secret_ref"][0]["key"], "redisPassword");
        assert!(sequencer["secret_ref"][0].get("name").is_none());
    }

    /// Layotto's sequencer `Config`: `biggerThan` beside `metadata`, and
    /// the etcd sequencer's metadata as Layotto's shipped
    /// `configs/config_sequencer_etcd.json` has it (segment fields, a bare
    /// `dialTimeout` in seconds), `;`-separated endpoints and its TLS
    /// names.
    #[test]
    fn layottos_sequencer_configs_become_rewire_metadata() {
        let document = mosn(serde_json::json!({
            "hellos": {"helloworld": {"hello": "greeting"}},
            "sequencer": {
                "etcd": {"metadata": {
                    "endpoints": "localhost:2379;localhost:2380",
                    "segmentCacheEnable": "false", "segmentStep": "1",
                    "username": "", "password": "", "dialTimeout": "5",
                    "tlsCa": "ca.pem", "tlsCert": "c.pem", "tlsCertKey": "k.pem"
                }},
                "redis": {"biggerThan": {"orders": 100},
                          "metadata": {"redisHost": "127.0.0.1:6379", "redisPassword": ""}},
                "both": {"type": "redis", "biggerThan": {"orders": 100},
                         "metadata": {"redisHost": "h:1",
                                      "biggerThan": {"users": 1, "orders": 5}}}
            },
            "app": {"app_id": "app1", "grpc_callback_port": 9999}
        }));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        assert!(converted.problems.is_empty(), "{:?}", converted.problems);
        let doc = Value::Object(converted.document);
        let etcd = &doc["components"]["sequencer"]["etcd"]["metadata"];
        assert_eq!(
            etcd,
            &serde_json::json!({
                "endpoints": "localhost:2379,localhost:2380", "username": "", "password": "",
                "dialTimeout": "5s", "caCert": "ca.pem", "clientCert": "c.pem",
                "clientKey": "k.pem"
            })
        );
        let redis = &doc["components"]["sequencer"]["redis"];
        assert_eq!(redis["metadata"]["biggerThan"]["orders"], 100);
        assert!(redis.get("biggerThan").is_none(), "{redis}");
        let both = &doc["components"]["sequencer"]["both"];
        // Layotto reads the top-level `biggerThan`: merged key by key, the
        // larger value kept.
        assert_eq!(
            both["metadata"]["biggerThan"],
            serde_json::json!({"orders": 100, "users": 1})
        );
        assert!(both.get("biggerThan").is_none(), "{both}");
        let notes = converted.notes.join("\n");
        for expected in [
            "sequencer.etcd.metadata.segmentCacheEnable: left out",
            "sequencer.etcd.metadata.segmentStep: left out",
            "sequencer.both.biggerThan.orders: 100 and the metadata's 5; the larger, 100, is kept",
        ] {
            assert!(notes.contains(expected), "{expected}: {notes}");
        }
        // A duration with a unit, and rewire's own files, are left alone.
        let document = mosn(serde_json::json!({
            "sequencer": {"etcd": {"metadata": {"endpoints": "h:1", "dialTimeout": "300ms"}}}
        }));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        let doc = Value::Object(converted.document);
        assert_eq!(
            doc["components"]["sequencer"]["etcd"]["metadata"]["dialTimeout"],
            "300ms"
        );
    }

    #[test]
    fn unsupported_blocks_and_fields_are_named_where_they_are() {
        let document = mosn(serde_json::json!({
            "bindings": {"http": {"metadata": {}}},
            "app": {"app_id": "a", "colour": "blue"}
        }));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        let text: Vec<String> = converted.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text.iter()
                .any(|t| t.contains("filters[0].config.grpc_config.bindings")
                    && t.contains("`bindings` is not supported")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("grpc_config.app.colour: unknown field")),
            "{text:?}"
        );
    }

    #[test]
    fn a_second_grpc_config_is_a_problem_and_other_top_level_settings_are_noted() {
        let mut document = mosn(serde_json::json!({"state": {"in-memory": {}}}));
        let second = serde_json::json!({"name": "grpc2", "filter_chains": [{"filters": [
            {"type": "grpc", "config": {"grpc_config": {"lock": {"in-memory": {}}}}}]}]});
        if let Some(listeners) = document
            .get_mut("servers")
            .and_then(|s| s.pointer_mut("/0/listeners"))
            .and_then(Value::as_array_mut)
        {
            listeners.push(second);
        }
        document.insert("tracing".into(), serde_json::json!({"enable": true}));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        let text: Vec<String> = converted.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "servers[0].listeners[2].filter_chains[0].filters[0].config.grpc_config: a second \
              `grpc_config` is not supported by rewire: only the first \
              (servers[0].listeners[1].filter_chains[0].filters[0].config.grpc_config) is loaded; \
              move its components there"
            ]
        );
        assert_eq!(
            converted.notes,
            ["`tracing`: a MOSN setting rewire does not read; left out"]
        );
    }

    #[test]
    fn a_mosn_file_without_grpc_config_is_refused() {
        let document = serde_json::json!({"servers": [{"listeners": []}]});
        let document = document.as_object().cloned().unwrap_or_default();
        assert!(is_layotto(&document));
        let problem = convert(&document).expect_err("no grpc_config");
        assert!(problem.to_string().contains("grpc_config"), "{problem}");
        let rewire = serde_json::json!({"servers": [], "components": {}});
        assert!(!is_layotto(rewire.as_object().unwrap_or(&Map::new())));
    }

    #[test]
    fn a_config_stores_top_level_connection_becomes_its_metadata() {
        let document = mosn(serde_json::json!({
            "config_stores": {
                "apollo": {"address": ["http://a:8080", "http://b:8080"], "app_id": "from-top",
                           "metadata": {"cluster": "default"}},
                "etcd": {"address": ["127.0.0.1:2379", "127.0.0.1:2380"], "timeout": "10",
                         "store_name": "etcd", "app_id": "app1"},
                "other": {"type": "etcd", "address": "h:1", "timeout": "soon",
                          "metadata": {"endpoints": "kept:1"}}
            }
        }));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        assert!(converted.problems.is_empty(), "{:?}", converted.problems);
        let doc = Value::Object(converted.document);
        let stores = &doc["components"]["config_store"];
        assert_eq!(
            stores["apollo"],
            serde_json::json!({"type": "apollo", "metadata": {
                "cluster": "default", "config_server": "http://a:8080,http://b:8080", "app_id": "from-top"}})
        );
        assert_eq!(
            stores["etcd"],
            serde_json::json!({"type": "etcd", "metadata": {
                "endpoints": "127.0.0.1:2379,127.0.0.1:2380", "dialTimeout": "10s"}})
        );
        assert_eq!(
            stores["other"],
            serde_json::json!({"type": "etcd", "metadata": {"endpoints": "kept:1"}})
        );
        let notes = converted.notes.join("\n");
        for expected in [
            "config_stores.etcd.store_name: left out (the store is named by its key, `etcd`)",
            "config_stores.etcd.app_id: left out (`etcd` does not take it)",
            "config_stores.other.address: left out (the metadata sets `endpoints`)",
            "config_stores.other.timeout: left out (\"soon\" is not what `dialTimeout` takes)",
        ] {
            assert!(notes.contains(expected), "{expected}: {notes}");
        }
    }

    #[test]
    fn a_store_under_both_spellings_of_the_block_is_a_problem() {
        let document = mosn(serde_json::json!({
            "config_store": {"settings": {"type": "in-memory"}},
            "config_stores": {"settings": {"type": "in-memory"}}
        }));
        let converted = convert(&document).unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(converted.problems.len(), 1, "{:?}", converted.problems);
        assert!(
            converted.problems[0].to_string().contains("declared twice"),
            "{:?}",
            converted.problems
        );
    }
}

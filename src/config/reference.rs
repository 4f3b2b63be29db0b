//! docs/configuration.md lists every key of the config file with its default. These tests read
//! its tables and hold them against the code: the keys each table's type accepts (asked of its
//! serde implementation, so a new field cannot be missed) and the defaults the code applies when
//! a key is left out. A key added, removed or given another default without the page changing
//! fails here, naming the table and the key.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

use serde::Deserialize;
use serde_aux::serde_introspection::serde_introspect;
use toml::Value;

use super::{
    FileConfig, ServeArgs, ServeConfig, model_proxy::ModelProxyFile, profile::PermissionRuleFile,
    profile::ProfileFile, sandbox,
};
use crate::domain::limits::Limits;

const PAGE: &str = include_str!("../../docs/configuration.md");

/// One row of a reference table: the key and its default as the page writes it.
#[derive(Debug)]
pub(crate) struct Row {
    pub key: String,
    pub default: String,
}

/// The page's reference tables (header `| key | default | …`), by the heading above each.
pub(crate) fn tables(page: &str) -> BTreeMap<String, Vec<Row>> {
    let mut tables: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    let mut heading = String::new();
    let mut in_table = false;
    let mut in_code = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(title) = line.strip_prefix('#') {
            heading = title.trim_start_matches('#').trim().to_owned();
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() < 4 {
            in_table = false;
            continue;
        }
        if cells[1] == "key" && cells[2] == "default" {
            in_table = true;
            assert!(
                !tables.contains_key(&heading),
                "two reference tables under {heading:?}"
            );
            tables.insert(heading.clone(), Vec::new());
            continue;
        }
        if !in_table || cells[1].starts_with("---") {
            continue;
        }
        tables.get_mut(&heading).expect("opened").push(Row {
            key: cells[1].trim_matches('`').to_owned(),
            default: cells[2].to_owned(),
        });
    }
    tables
}

/// A default cell read: `None` for "none …", else the TOML value in its first backticks.
pub(crate) fn documented_default(cell: &str) -> Result<Option<Value>, String> {
    if cell.starts_with("none") {
        return Ok(None);
    }
    let literal = cell
        .strip_prefix('`')
        .and_then(|rest| rest.split_once('`'))
        .map(|(literal, _)| literal)
        .ok_or_else(|| format!("neither \"none …\" nor a `value`: {cell:?}"))?;
    toml::from_str::<toml::Table>(&format!("v = {literal}"))
        .map_err(|e| format!("{literal:?} is not a TOML value: {e}"))
        .map(|mut table| table.remove("v"))
}

/// Whether the page's default and the code's agree: the same value (durations compared as
/// durations, `"120s"` = `"2m"`), or both unset (an empty list or table is unset).
fn agree(documented: &Option<Value>, code: &Option<Value>) -> bool {
    let unset = |v: &Option<Value>| match v {
        None => true,
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Table(t)) => t.is_empty(),
        Some(_) => false,
    };
    match (documented, code) {
        (Some(Value::String(a)), Some(Value::String(b))) => {
            a == b
                || matches!(
                    (humantime::parse_duration(a), humantime::parse_duration(b)),
                    (Ok(x), Ok(y)) if x == y
                )
        }
        (a, b) if unset(a) && unset(b) => true,
        (a, b) => a == b,
    }
}

/// Checks one table: the same keys as the type's, each default as the code's.
pub(crate) fn check(
    heading: &str,
    fields: &[&str],
    defaults: &BTreeMap<&str, Option<Value>>,
) -> Vec<String> {
    let tables = tables(PAGE);
    let Some(rows) = tables.get(heading) else {
        return vec![format!(
            "docs/configuration.md has no table under {heading:?}"
        )];
    };
    let mut problems = Vec::new();
    let documented: BTreeSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let accepted: BTreeSet<&str> = fields.iter().copied().collect();
    for key in accepted.difference(&documented) {
        problems.push(format!(
            "{heading}: `{key}` is a key the code reads; the page lacks it"
        ));
    }
    for key in documented.difference(&accepted) {
        problems.push(format!(
            "{heading}: `{key}` is on the page; the code reads no such key"
        ));
    }
    for key in &accepted {
        assert!(
            defaults.contains_key(key),
            "{heading}: the test gives no default for `{key}`: add it"
        );
    }
    for row in rows {
        let Some(code) = defaults.get(row.key.as_str()) else {
            continue;
        };
        match documented_default(&row.default) {
            Err(e) => problems.push(format!("{heading}: `{}`: {e}", row.key)),
            Ok(documented) if !agree(&documented, code) => problems.push(format!(
                "{heading}: `{}` defaults to {} in the code; the page says {:?}",
                row.key,
                code.as_ref()
                    .map_or_else(|| "nothing (unset)".to_owned(), Value::to_string),
                row.default
            )),
            Ok(_) => {}
        }
    }
    problems
}

/// The fields a config type's serde implementation reads.
pub(crate) fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    serde_introspect::<T>()
}

pub(crate) fn text(value: impl ToString) -> Option<Value> {
    Some(Value::String(value.to_string()))
}

pub(crate) fn duration(value: Duration) -> Option<Value> {
    text(humantime::format_duration(value))
}

/// A value as the config file writes it (an enum by its serde name, as the file is read).
pub(crate) fn written(value: impl serde::Serialize) -> Option<Value> {
    Some(Value::try_from(value).expect("a TOML value"))
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "docs/configuration.md and the code disagree:\n{}",
        problems.join("\n")
    );
}

/// A profile of a table with only `extra` written, resolved as the server resolves it.
fn resolved_profile(extra: &str) -> super::Profile {
    toml::from_str::<ProfileFile>(extra)
        .expect("a profile table")
        .resolve("p")
        .expect("resolves")
}

#[test]
fn every_top_level_key_is_documented_with_the_default_the_server_applies() {
    let config = ServeConfig::from_parts(
        ServeArgs::default(),
        FileConfig::default(),
        PathBuf::from("agent-harness"),
    )
    .expect("the defaults resolve");
    let tables = ["limits", "sandbox", "model_proxy", "profiles"];
    let fields: Vec<&str> = fields_of::<FileConfig>()
        .iter()
        .copied()
        .filter(|f| !tables.contains(f))
        .collect();
    let services = {
        let set = config.services;
        let mut names = Vec::new();
        for (on, name) in [
            (set.sessions, "sessions"),
            (set.translator, "translator"),
            (set.gateway, "gateway"),
        ] {
            if on {
                names.push(Value::String(name.into()));
            }
        }
        Some(Value::Array(names))
    };
    let path = |p: &Option<PathBuf>| p.as_ref().and_then(|p| text(p.display()));
    let tls = config.tls.as_ref();
    let defaults: BTreeMap<&str, Option<Value>> = [
        ("listen", text(config.listen)),
        ("data_dir", text(config.data_dir.display())),
        (
            "static_files_base_url",
            config.static_files_base_url.as_ref().and_then(text),
        ),
        ("services", services),
        ("metrics_listen", config.metrics_listen.and_then(text)),
        (
            "otlp_endpoint",
            config.otlp_endpoint.as_ref().and_then(text),
        ),
        ("tokens_file", path(&config.tokens_file)),
        ("tls_cert", tls.and_then(|t| text(t.cert.display()))),
        ("tls_key", tls.and_then(|t| text(t.key.display()))),
        (
            "tls_client_ca",
            path(&tls.and_then(|t| t.client_ca.clone())),
        ),
        (
            "insecure_allow_non_loopback",
            Some(Value::Boolean(config.insecure_allow_non_loopback)),
        ),
        ("log_format", written(config.log_format)),
        ("sqlite_synchronous", written(config.sqlite_synchronous)),
        (
            "database_url",
            config.database_url.as_ref().and_then(|u| text(u.expose())),
        ),
        ("statement_timeout", duration(config.statement_timeout)),
        ("drain_grace", duration(config.drain_grace)),
        (
            "advertise_address",
            config.advertise_address.as_ref().and_then(text),
        ),
        ("lease_ttl", duration(config.lease_ttl)),
        ("retention", config.retention.and_then(duration)),
        ("replica_token_file", path(&config.replica_token_file)),
        ("replica_tls_ca", path(&config.replica_tls_ca)),
        (
            "cors_allow_origins",
            Some(Value::Array(
                config
                    .browser
                    .cors_allow_origins
                    .iter()
                    .map(|o| Value::String(o.clone()))
                    .collect(),
            )),
        ),
        ("grpc_web", Some(Value::Boolean(config.browser.grpc_web))),
        ("console", Some(Value::Boolean(config.browser.console))),
        ("invocation_meta_key", text(&config.invocation_meta_key)),
    ]
    .into_iter()
    .collect();
    assert_none(check("Keys at the top level", &fields, &defaults));
}

#[test]
fn every_limit_is_documented_with_its_default() {
    let limits = Value::try_from(Limits::default()).expect("limits serialise");
    let defaults: BTreeMap<&str, Option<Value>> = fields_of::<Limits>()
        .iter()
        .map(|&key| (key, limits.get(key).cloned()))
        .collect();
    assert_none(check("`[limits]`", fields_of::<Limits>(), &defaults));
}

#[test]
fn every_sandbox_key_is_documented_with_its_default() {
    let defaults: BTreeMap<&str, Option<Value>> = [
        ("homes_dir", None),
        ("uid", None),
        ("gid", None),
        ("cgroup", None),
        ("npm_cache", None),
        ("memory", text(sandbox::DEFAULT_MEMORY)),
        ("pids", Some(Value::Integer(sandbox::DEFAULT_PIDS as i64))),
        ("cpu", None),
    ]
    .into_iter()
    .collect();
    // What the table leaves out resolves to exactly these limits.
    let limits = sandbox::SandboxFile::default().defaults().unwrap().limits;
    assert_eq!(
        limits.memory,
        Some(crate::acp::sandbox::parse_size(sandbox::DEFAULT_MEMORY).unwrap())
    );
    assert_eq!(limits.pids, Some(sandbox::DEFAULT_PIDS));
    assert_eq!(limits.cpu_millis, None);
    assert_none(check(
        "`[sandbox]`",
        fields_of::<sandbox::SandboxFile>(),
        &defaults,
    ));
}

#[test]
fn every_model_proxy_key_is_documented_with_its_default() {
    let settings = super::model_proxy::settings(&ModelProxyFile::default()).unwrap();
    let defaults: BTreeMap<&str, Option<Value>> = [
        ("timeout", duration(settings.limits.timeout)),
        ("prices", None),
    ]
    .into_iter()
    .collect();
    assert!(settings.prices.is_empty());
    assert_none(check(
        "`[model_proxy]`",
        fields_of::<ModelProxyFile>(),
        &defaults,
    ));
}

#[test]
fn every_profile_key_is_documented_with_the_default_a_profile_resolves_to() {
    let profile = resolved_profile("command = \"agent\"");
    let remote = resolved_profile("kind = \"remote\"\nbridge_profile = \"b\"");
    let resilience = &profile.resilience;
    let defaults: BTreeMap<&str, Option<Value>> = [
        ("kind", text("local")),
        ("preset", None),
        ("command", None),
        ("args", None),
        ("env", None),
        ("env_passthrough", None),
        ("env_files", None),
        ("config_options", None),
        ("auth_method", profile.auth_method.as_ref().and_then(text)),
        ("permission_policy", written(profile.permission_policy)),
        ("permission_rules", None),
        (
            "permission_timeout",
            profile.permission_timeout.and_then(duration),
        ),
        ("allowed_cwd_roots", None),
        ("startup_timeout", duration(profile.startup_timeout)),
        ("turn_timeout", profile.turn_timeout.and_then(duration)),
        ("cancel_grace", duration(profile.cancel_grace)),
        ("idle_timeout", profile.idle_timeout.and_then(duration)),
        ("stop_grace", duration(resilience.stop_grace)),
        (
            "restart_after_cancel",
            Some(Value::Boolean(resilience.restart_after_cancel)),
        ),
        (
            "restart_after_error",
            Some(Value::Boolean(resilience.restart_after_error)),
        ),
        ("on_reopen_failure", written(resilience.on_reopen_failure)),
        (
            "reopen_context_bytes",
            Some(Value::Integer(resilience.reopen_context_bytes as i64)),
        ),
        ("warm_pool", Some(Value::Integer(profile.warm_pool as i64))),
        ("sandbox", text("on")),
        ("egress", None),
        ("model_proxy", None),
        ("bridge_profile", None),
        ("bridge_labels", None),
        ("bridge_principals", None),
        (
            "reconnect_grace",
            remote
                .remote
                .as_ref()
                .and_then(|r| duration(r.reconnect_grace)),
        ),
    ]
    .into_iter()
    .collect();
    // The keys given no default above resolve to nothing, and a profile is boxed by default
    // with nowhere to connect.
    assert!(profile.args.is_empty() && profile.env.is_empty() && profile.secrets.is_empty());
    assert!(profile.config_options.is_empty() && profile.permission_rules.is_empty());
    assert!(profile.allowed_cwd_roots.is_none() && profile.remote.is_none());
    let boxed = profile
        .sandbox
        .as_ref()
        .expect("boxed unless sandbox = \"off\"");
    assert_eq!(boxed.egress, crate::acp::sandbox::Egress::Allow(Vec::new()));
    assert!(boxed.model.is_empty());
    assert_none(check(
        "`[profiles.<name>]`",
        fields_of::<ProfileFile>(),
        &defaults,
    ));
}

#[test]
fn a_profiles_sandbox_egress_model_proxy_and_permission_rule_tables_are_documented() {
    let mut problems = check(
        "A profile's `sandbox` table",
        sandbox::profile_sandbox_fields(),
        &[
            ("read_only", None),
            ("read_write", None),
            ("memory", None),
            ("pids", None),
            ("cpu", None),
            ("home_seed", None),
            ("nested", Some(Value::Boolean(false))),
        ]
        .into_iter()
        .collect(),
    );
    problems.extend(check(
        "A profile's `egress`",
        sandbox::profile_egress_fields(),
        &[("allow", None)].into_iter().collect(),
    ));
    problems.extend(check(
        "A profile's `model_proxy`",
        sandbox::model_route_fields(),
        &[("key", None), ("upstream", None)].into_iter().collect(),
    ));
    problems.extend(check(
        "`[[profiles.<name>.permission_rules]]`",
        fields_of::<PermissionRuleFile>(),
        &[("kind", None), ("title_regex", None), ("decision", None)]
            .into_iter()
            .collect(),
    ));
    // `nested` left out is off.
    let boxed = resolved_profile("command = \"agent\"");
    assert!(!boxed.sandbox.unwrap().nested);
    assert_none(problems);
}

#[test]
fn a_table_without_a_reference_heading_is_not_read_as_one() {
    let page = "## A\n\n| key | default | what |\n|---|---|---|\n| `a` | `1` | x |\n\ntext\n\n| other | table |\n|---|---|\n| `b` | c |\n";
    let tables = tables(page);
    assert_eq!(tables.len(), 1);
    assert_eq!(tables["A"].len(), 1);
    assert_eq!(
        documented_default("`\"30s\"` (more)").unwrap(),
        Some(Value::String("30s".into()))
    );
    assert_eq!(documented_default("none (nothing)").unwrap(), None);
    assert!(documented_default("thirty").is_err());
    assert!(agree(&text("120s"), &text("2m")));
    assert!(agree(&None, &Some(Value::Array(Vec::new()))));
    assert!(!agree(&text("1s"), &text("2s")));
}

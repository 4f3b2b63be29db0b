//! The flags of `agent-harness mock-agent` (documented in `docs/mock-agent.md`).

use std::fmt;

/// One `--config-option ID=V1|V2|...`: an extra `select` option whose current value is the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectOptionSpec {
    pub id: String,
    pub values: Vec<String>,
}

impl std::str::FromStr for SelectOptionSpec {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let (id, values) = spec
            .split_once('=')
            .ok_or_else(|| format!("expected ID=V1|V2|..., got {spec:?}"))?;
        let id = id.trim();
        if id.is_empty() {
            return Err(format!("empty option id in {spec:?}"));
        }
        let values: Vec<String> = values.split('|').map(|v| v.trim().to_owned()).collect();
        if values.iter().any(String::is_empty) {
            return Err(format!("empty value in {spec:?}"));
        }
        Ok(Self {
            id: id.to_owned(),
            values,
        })
    }
}

impl fmt::Display for SelectOptionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.id, self.values.join("|"))
    }
}

/// The flags of `agent-harness mock-agent`: a deterministic, scripted ACP agent on stdin/stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct MockAgentArgs {
    /// Advertise session resume (`sessionCapabilities.resume`) and serve `session/resume`
    #[arg(long)]
    pub resume: bool,
    /// Advertise session fork (`sessionCapabilities.fork`, unstable in ACP 1.20) and serve
    /// `session/fork`
    #[arg(long)]
    pub fork: bool,
    /// Advertise `loadSession` and serve `session/load` (replays a short fixed history first)
    #[arg(long)]
    pub load: bool,
    /// Models offered by the `model` select option (category `model`); the first is current
    #[arg(
        long,
        value_name = "A,B,...",
        value_delimiter = ',',
        default_value = "mock-fast,mock-smart"
    )]
    pub models: Vec<String>,
    /// Advertise no model option at all
    #[arg(long, conflicts_with = "models")]
    pub no_models: bool,
    /// An extra select option (no category; the first value is current); repeatable
    #[arg(long = "config-option", value_name = "ID=V1|V2|...")]
    pub config_options: Vec<SelectOptionSpec>,
    /// An extra boolean option, current value false; repeatable
    #[arg(long = "bool-option", value_name = "ID")]
    pub bool_options: Vec<String>,
    /// Write TEXT and a newline to stderr before anything else
    #[arg(long, value_name = "TEXT")]
    pub stderr_at_start: Option<String>,
    /// Exit at once with CODE (after --stderr-at-start)
    #[arg(long, value_name = "CODE", allow_negative_numbers = true)]
    pub exit_at_start: Option<i32>,
    /// Answer `initialize` with a JSON-RPC error
    #[arg(long, conflicts_with = "hang_initialize")]
    pub fail_initialize: bool,
    /// Never answer `initialize`
    #[arg(long)]
    pub hang_initialize: bool,
    /// Wait MS milliseconds before answering `initialize` (a slow handshake)
    #[arg(long, value_name = "MS")]
    pub delay_initialize: Option<u64>,
    /// Answer `session/new` with a JSON-RPC error
    #[arg(long, conflicts_with = "auth_required")]
    pub fail_new_session: bool,
    /// Answer `session/new` with error -32000 "authentication required" (until `authenticate`
    /// with an --auth-method)
    #[arg(long)]
    pub auth_required: bool,
    /// Advertise a sign-in method in `initialize`'s `authMethods` (repeatable); `authenticate`
    /// with one of them is answered `{}` and lifts --auth-required
    #[arg(long = "auth-method", value_name = "ID[=NAME]")]
    pub auth_methods: Vec<String>,
    /// Never honour `session/cancel`
    #[arg(long)]
    pub ignore_cancel: bool,
    /// Answer `session/new` with a session id padded to BYTES bytes (a hostile agent)
    #[arg(long, value_name = "BYTES")]
    pub session_id_bytes: Option<usize>,
    /// When asked for `session/new` while FILE exists: remove it and exit with code 1 instead
    /// of answering (one crash among several starts of the same command line)
    #[arg(long, value_name = "FILE")]
    pub crash_on_new_session_once: Option<std::path::PathBuf>,
    /// Keep a file per session in DIR; `session/resume` and `session/load` of a session with no
    /// file (and unknown to this process) fail -32002 "Resource not found"
    #[arg(long, value_name = "DIR")]
    pub session_dir: Option<std::path::PathBuf>,
    /// With --session-dir: write a session's file only MS milliseconds after it changed, or at
    /// once on SIGTERM or at the end of stdin (a lazily written session, as Claude Code's)
    #[arg(long, value_name = "MS", requires = "session_dir")]
    pub save_delay: Option<u64>,
    /// Ignore SIGTERM (only SIGKILL ends the agent then; the end of stdin still does)
    #[arg(long)]
    pub ignore_sigterm: bool,
}

impl Default for MockAgentArgs {
    /// The same as running `agent-harness mock-agent` with no flags.
    fn default() -> Self {
        Self {
            resume: false,
            fork: false,
            load: false,
            models: vec!["mock-fast".to_owned(), "mock-smart".to_owned()],
            no_models: false,
            config_options: Vec::new(),
            bool_options: Vec::new(),
            stderr_at_start: None,
            exit_at_start: None,
            fail_initialize: false,
            hang_initialize: false,
            delay_initialize: None,
            fail_new_session: false,
            auth_required: false,
            auth_methods: Vec::new(),
            ignore_cancel: false,
            session_id_bytes: None,
            crash_on_new_session_once: None,
            session_dir: None,
            save_delay: None,
            ignore_sigterm: false,
        }
    }
}

#[derive(clap::Parser)]
#[command(name = "mock-agent")]
struct FlagsOnly {
    #[command(flatten)]
    args: MockAgentArgs,
}

impl MockAgentArgs {
    /// Parses the flags as they would follow `agent-harness mock-agent` (for tests and for
    /// running the agent in-process).
    pub fn from_flags<I, S>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        let argv = std::iter::once(std::ffi::OsString::from("mock-agent"))
            .chain(flags.into_iter().map(Into::into));
        FlagsOnly::try_parse_from(argv).map(|parsed| parsed.args)
    }

    /// Checks what clap cannot: model names non-empty, config option ids unique.
    pub fn validate(&self) -> Result<(), String> {
        let mut ids: Vec<&str> = Vec::new();
        if !self.no_models {
            if self.models.is_empty() || self.models.iter().any(|m| m.trim().is_empty()) {
                return Err("--models needs one or more non-empty names".to_owned());
            }
            ids.push("model");
        }
        for id in self
            .config_options
            .iter()
            .map(|o| o.id.as_str())
            .chain(self.bool_options.iter().map(String::as_str))
        {
            if id.trim().is_empty() {
                return Err("a config option id is empty".to_owned());
            }
            if ids.contains(&id) {
                return Err(format!("config option id {id:?} is advertised twice"));
            }
            ids.push(id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_flags_mean_the_default_models_and_nothing_else() {
        let args = MockAgentArgs::from_flags(Vec::<String>::new()).unwrap();
        assert_eq!(args.models, ["mock-fast", "mock-smart"]);
        assert!(!args.resume && !args.load && !args.no_models && !args.ignore_cancel);
        assert!(args.config_options.is_empty() && args.bool_options.is_empty());
        assert_eq!(args.exit_at_start, None);
        let default = MockAgentArgs::default();
        assert_eq!(default.models, args.models);
        assert!(args.validate().is_ok());
    }

    #[test]
    fn every_flag_parses_as_documented() {
        let args = MockAgentArgs::from_flags([
            "--resume",
            "--load",
            "--models",
            "a,b,c",
            "--config-option",
            "effort=low|high",
            "--config-option",
            "mode=ask|code",
            "--bool-option",
            "web",
            "--stderr-at-start",
            "hello",
            "--exit-at-start",
            "7",
            "--fail-initialize",
            "--fail-new-session",
            "--ignore-cancel",
        ])
        .unwrap();
        assert!(args.resume && args.load && args.fail_initialize && args.fail_new_session);
        assert!(args.ignore_cancel);
        assert_eq!(args.models, ["a", "b", "c"]);
        assert_eq!(
            args.config_options,
            [
                SelectOptionSpec {
                    id: "effort".into(),
                    values: vec!["low".into(), "high".into()]
                },
                SelectOptionSpec {
                    id: "mode".into(),
                    values: vec!["ask".into(), "code".into()]
                },
            ]
        );
        assert_eq!(args.bool_options, ["web"]);
        assert_eq!(args.stderr_at_start.as_deref(), Some("hello"));
        assert_eq!(args.exit_at_start, Some(7));
        assert!(args.validate().is_ok());
    }

    #[test]
    fn no_models_conflicts_with_an_explicit_models_list_but_not_the_default() {
        assert!(
            MockAgentArgs::from_flags(["--no-models"])
                .unwrap()
                .no_models
        );
        assert!(MockAgentArgs::from_flags(["--no-models", "--models", "x"]).is_err());
    }

    #[test]
    fn a_malformed_config_option_or_a_duplicate_id_is_refused() {
        assert!(MockAgentArgs::from_flags(["--config-option", "novalues"]).is_err());
        assert!(MockAgentArgs::from_flags(["--config-option", "=a|b"]).is_err());
        assert!(MockAgentArgs::from_flags(["--config-option", "x=a||b"]).is_err());
        let dup = MockAgentArgs::from_flags(["--config-option", "model=a|b"]).unwrap();
        assert!(dup.validate().unwrap_err().contains("model"));
        let dup = MockAgentArgs::from_flags(["--bool-option", "x", "--bool-option", "x"]).unwrap();
        assert!(dup.validate().is_err());
        let blank = MockAgentArgs::from_flags(["--models", ""]).unwrap();
        assert!(blank.validate().is_err());
    }

    #[test]
    fn a_save_delay_needs_a_session_dir() {
        assert!(MockAgentArgs::from_flags(["--save-delay", "100"]).is_err());
        let args =
            MockAgentArgs::from_flags(["--session-dir", "/tmp/x", "--save-delay", "100"]).unwrap();
        assert_eq!(args.save_delay, Some(100));
        assert!(
            MockAgentArgs::from_flags(["--ignore-sigterm"])
                .unwrap()
                .ignore_sigterm
        );
    }

    #[test]
    fn a_negative_exit_code_is_accepted() {
        let args = MockAgentArgs::from_flags(["--exit-at-start", "-1"]).unwrap();
        assert_eq!(args.exit_at_start, Some(-1));
    }
}

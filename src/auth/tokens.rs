//! The tokens file and the table it loads into.
//!
//! ```toml
//! [[tokens]]
//! sha256 = "<64 lower-case hex digits: SHA-256 of the token>"
//! principal = "ada"
//! kind = "user"      # or "service", "replica", "runtime" (a bridge: it may only Connect)
//!
//! [[tokens]]
//! sha256 = "..."
//! principal = "sandbox-7"
//! kind = "runtime"
//! labels = { pool = "sandbox", zone = "*" }   # optional, runtime rows only
//!
//! [[tokens]]
//! sha256 = "..."
//! principal = "bob"
//! kind = "user"
//! budget = { cost = "25.00", currency = "USD", tokens = 2000000, period = "month" }
//! ```
//!
//! `budget` (user and service rows) bounds what the principal's sessions may spend per period
//! (`day`, `week` or `month`, UTC; default `month`): a cost in one currency, a number of tokens
//! (input plus output), or both. Rows of one principal must not disagree about its budget.
//!
//! `labels` on a runtime row bounds what its bridges may claim in their hello: every label a
//! hello carries must be listed, with the same value or with `"*"` (any value for that key).
//! Without `labels` a bridge may claim any. A profile's `bridge_labels` select bridges, so a
//! token allowed every label could attract sessions meant for other bridges.
//!
//! The file never holds a token, only its digest. A request's bearer token is hashed and compared
//! with **every** digest of the table in constant time (no early exit, no lookup keyed by the
//! presented value), so response timing tells nothing about how close a guess came or which entry
//! matched. Errors about the file never quote its values: a misplaced raw token must not end up
//! in a log.

use std::{collections::BTreeMap, path::Path};

use anyhow::Context;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::domain::{
    PrincipalKind,
    usage::{self, Budget, Period},
};

/// Longest principal id a tokens file may name, in bytes (as `x-acting-user`).
pub(crate) const MAX_PRINCIPAL_BYTES: usize = 256;

/// A SHA-256 digest.
pub(crate) type Digest32 = [u8; 32];

/// The kinds a token may carry (`local` exists only without tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindField {
    User,
    Service,
    Replica,
    /// A bridge: it may call only `RuntimeGatewayService.Connect`.
    Runtime,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    tokens: Vec<RowFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RowFormat {
    sha256: String,
    principal: String,
    kind: KindField,
    /// Runtime rows only: the labels its bridges may claim (module doc).
    labels: Option<BTreeMap<String, String>>,
    budget: Option<BudgetFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetFormat {
    /// A decimal string, so no amount is rounded on its way in.
    cost: Option<String>,
    currency: Option<String>,
    tokens: Option<u64>,
    period: Option<String>,
}

impl BudgetFormat {
    /// The budget, or what is wrong with it (naming the key under `at`).
    fn check(self, at: &str) -> anyhow::Result<Budget> {
        let period = match self.period.as_deref() {
            None => Period::Month,
            Some(text) => Period::parse(text).ok_or_else(|| {
                anyhow::anyhow!("{at}.period must be \"day\", \"week\" or \"month\"")
            })?,
        };
        let cost = match (self.cost, self.currency) {
            (None, None) => None,
            (Some(cost), Some(currency)) => {
                let micros = usage::decimal_to_micros(&cost).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{at}.cost must be a decimal string such as \"25.00\" (at most six \
                         fraction digits)"
                    )
                })?;
                let valid = (1..=16).contains(&currency.len())
                    && currency.bytes().all(|b| b.is_ascii_alphanumeric());
                if !valid {
                    anyhow::bail!("{at}.currency must be a currency code such as \"USD\"");
                }
                Some((micros, currency))
            }
            (Some(_), None) => anyhow::bail!("{at}.currency is required with {at}.cost"),
            (None, Some(_)) => anyhow::bail!("{at}.cost is required with {at}.currency"),
        };
        if cost.is_none() && self.tokens.is_none() {
            anyhow::bail!("{at} must set cost (with currency), tokens, or both");
        }
        Ok(Budget {
            cost,
            tokens: self.tokens,
            period,
        })
    }
}

/// A label value in a runtime row's `labels` that allows any value for its key.
pub(crate) const ANY_LABEL_VALUE: &str = "*";

/// What a valid token grants: who the caller is. Also the identity of an open stream's
/// credential, so a reload can tell whether it still holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub digest: Digest32,
    pub principal: String,
    pub kind: PrincipalKind,
    /// A runtime token's allowed bridge labels (`None`: any).
    pub labels: Option<BTreeMap<String, String>>,
}

impl Grant {
    /// The first of `claimed` labels this grant does not allow, if any.
    pub(crate) fn disallowed_label<'a>(
        &self,
        claimed: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Option<&'a str> {
        let allowed = self.labels.as_ref()?;
        claimed
            .into_iter()
            .find(|(key, value)| {
                allowed
                    .get(*key)
                    .is_none_or(|a| a != ANY_LABEL_VALUE && a != *value)
            })
            .map(|(key, _)| key.as_str())
    }
}

/// The loaded tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TokenTable {
    grants: Vec<Grant>,
    /// Budgets by principal.
    budgets: BTreeMap<String, Budget>,
}

/// The SHA-256 digest of a token.
pub(crate) fn digest(token: &str) -> Digest32 {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenTable {
    /// Reads and validates a tokens file; the error names the file and what is wrong with it.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading tokens file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("tokens file {}", path.display()))
    }

    /// Parses the text of a tokens file.
    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        let file: FileFormat = toml::from_str(text).map_err(|e| {
            // toml's own rendering quotes the offending line, which may hold a secret.
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            match line {
                Some(line) => anyhow::anyhow!("line {line}: {}", e.message()),
                None => anyhow::anyhow!("{}", e.message()),
            }
        })?;
        let mut grants: Vec<Grant> = Vec::with_capacity(file.tokens.len());
        let mut budgets: BTreeMap<String, Budget> = BTreeMap::new();
        for (index, row) in file.tokens.into_iter().enumerate() {
            let at = format!("tokens[{index}]");
            let digest = parse_digest(&row.sha256).ok_or_else(|| {
                anyhow::anyhow!(
                    "{at}.sha256 must be the SHA-256 digest of the token as 64 lower-case hex \
                     digits (e.g. `printf %s \"$TOKEN\" | sha256sum`); the file never holds the \
                     token itself"
                )
            })?;
            check_principal(&row.principal).with_context(|| format!("{at}.principal"))?;
            let kind = match row.kind {
                KindField::User => PrincipalKind::User,
                KindField::Service => PrincipalKind::Service,
                KindField::Replica => PrincipalKind::Replica,
                KindField::Runtime => PrincipalKind::Runtime,
            };
            if row.labels.is_some() && kind != PrincipalKind::Runtime {
                anyhow::bail!("{at}.labels is only for kind = \"runtime\" (a bridge's token)");
            }
            if let Some(budget) = row.budget {
                let at = format!("{at}.budget");
                if !matches!(kind, PrincipalKind::User | PrincipalKind::Service) {
                    anyhow::bail!("{at} is only for kind = \"user\" or \"service\"");
                }
                let budget = budget.check(&at)?;
                if budgets
                    .get(&row.principal)
                    .is_some_and(|other| *other != budget)
                {
                    anyhow::bail!(
                        "{at} differs from the budget another row gives principal {:?}",
                        row.principal
                    );
                }
                budgets.insert(row.principal.clone(), budget);
            }
            if grants.iter().any(|g| g.digest == digest) {
                anyhow::bail!("{at}.sha256 appears twice in the file");
            }
            if let Some(other) = grants
                .iter()
                .find(|g| g.principal == row.principal && g.kind != kind)
            {
                anyhow::bail!(
                    "{at}: principal {:?} is both a {} and a {}",
                    row.principal,
                    other.kind.as_str(),
                    kind.as_str()
                );
            }
            grants.push(Grant {
                digest,
                principal: row.principal,
                kind,
                labels: row.labels,
            });
        }
        Ok(Self { grants, budgets })
    }

    /// The budget the file sets for a principal, if any.
    pub(crate) fn budget(&self, principal: &str) -> Option<&Budget> {
        self.budgets.get(principal)
    }

    pub(crate) fn len(&self) -> usize {
        self.grants.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The grant of a presented token, comparing its digest with every entry in constant time.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Grant> {
        let presented = digest(token);
        let mut found = subtle::Choice::from(0);
        let mut index: u64 = 0;
        for (i, grant) in self.grants.iter().enumerate() {
            let equal = grant.digest[..].ct_eq(&presented[..]);
            index.conditional_assign(&(i as u64), equal);
            found |= equal;
        }
        bool::from(found).then(|| self.grants[index as usize].clone())
    }

    /// Whether a grant made earlier still holds (its token is still listed, for the same
    /// principal and kind).
    pub(crate) fn still_grants(&self, grant: &Grant) -> bool {
        self.grants.iter().any(|g| g == grant)
    }

    /// How many grants of `self` the `next` table no longer holds.
    pub(crate) fn revoked_by(&self, next: &TokenTable) -> usize {
        self.grants.iter().filter(|g| !next.still_grants(g)).count()
    }
}

fn parse_digest(text: &str) -> Option<Digest32> {
    if text.len() != 64
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// A principal id: 1 to [`MAX_PRINCIPAL_BYTES`] bytes, no control characters, no surrounding
/// whitespace (it is compared exactly with session owners and editors).
pub(crate) fn check_principal(id: &str) -> anyhow::Result<()> {
    if id.is_empty() || id.len() > MAX_PRINCIPAL_BYTES {
        anyhow::bail!("must hold 1 to {MAX_PRINCIPAL_BYTES} bytes");
    }
    if id.chars().any(char::is_control) || id.trim() != id {
        anyhow::bail!("must not hold control characters or surrounding whitespace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(token: &str, principal: &str, kind: &str) -> String {
        format!(
            "[[tokens]]\nsha256 = \"{}\"\nprincipal = \"{principal}\"\nkind = \"{kind}\"\n",
            hex::encode(digest(token))
        )
    }

    #[test]
    fn a_listed_token_grants_its_principal_and_kind_and_nothing_else_does() {
        let table =
            TokenTable::parse(&(row("t-ada", "ada", "user") + &row("t-ci", "ci", "service")))
                .unwrap();
        assert_eq!(table.len(), 2);
        let ada = table.authenticate("t-ada").unwrap();
        assert_eq!(
            (ada.principal.as_str(), ada.kind),
            ("ada", PrincipalKind::User)
        );
        let ci = table.authenticate("t-ci").unwrap();
        assert_eq!(
            (ci.principal.as_str(), ci.kind),
            ("ci", PrincipalKind::Service)
        );
        assert_eq!(table.authenticate("t-ad"), None);
        assert_eq!(table.authenticate(""), None);
        assert_eq!(TokenTable::default().authenticate("t-ada"), None);
    }

    #[test]
    fn an_empty_file_is_a_table_that_grants_nothing() {
        let table = TokenTable::parse("").unwrap();
        assert!(table.is_empty());
        assert_eq!(table.authenticate("anything"), None);
    }

    #[test]
    fn a_grant_no_longer_holds_once_its_token_is_removed_or_its_principal_changes() {
        let before =
            TokenTable::parse(&(row("a", "ada", "user") + &row("b", "bob", "user"))).unwrap();
        let grant = before.authenticate("a").unwrap();
        let without = TokenTable::parse(&row("b", "bob", "user")).unwrap();
        assert!(!without.still_grants(&grant));
        assert_eq!(before.revoked_by(&without), 1);
        let renamed =
            TokenTable::parse(&(row("a", "eve", "user") + &row("b", "bob", "user"))).unwrap();
        assert!(!renamed.still_grants(&grant));
        assert!(before.still_grants(&grant));
        assert_eq!(before.revoked_by(&before.clone()), 0);
    }

    #[test]
    fn a_malformed_file_is_refused_naming_the_problem_without_quoting_secrets() {
        let cases: &[(&str, &str)] = &[
            (
                "[[tokens]]\nsha256 = \"ABC\"\nprincipal = \"a\"\nkind = \"user\"",
                "tokens[0].sha256",
            ),
            (
                "[[tokens]]\ntoken = \"hunter2-secret\"\nprincipal = \"a\"\nkind = \"user\"",
                "unknown field `token`",
            ),
            (&row("x", "a", "admin"), "admin"),
            (&row("x", "", "user"), "tokens[0].principal"),
            (&row("x", " a", "user"), "tokens[0].principal"),
            (
                &(row("x", "a", "user") + &row("x", "b", "user")),
                "appears twice",
            ),
            (
                &(row("x", "a", "user") + &row("y", "a", "service")),
                "both a user and a service",
            ),
            ("[[tokens]\n", "line 1"),
            ("tokens = 3", "line 1"),
            ("[other]\n", "unknown field `other`"),
        ];
        for (text, needle) in cases {
            let err = format!("{:#}", TokenTable::parse(text).unwrap_err());
            assert!(err.contains(needle), "{text:?} → {err}");
            assert!(!err.contains("hunter2"), "a secret leaked into {err}");
        }
        let upper = row("x", "a", "user").replace(
            &hex::encode(digest("x")),
            &hex::encode(digest("x")).to_uppercase(),
        );
        assert!(TokenTable::parse(&upper).is_err(), "digests are lower-case");
    }

    #[test]
    fn a_runtime_rows_labels_bound_what_its_bridges_may_claim_and_other_rows_may_not_have_them() {
        let text = row("t-b", "sandbox-7", "runtime")
            + "labels = { pool = \"sandbox\", zone = \"*\" }\n"
            + &row("t-c", "free", "runtime");
        let table = TokenTable::parse(&text).unwrap();
        let bounded = table.authenticate("t-b").unwrap();
        let claim = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ok = claim(&[("pool", "sandbox"), ("zone", "eu-1")]);
        assert_eq!(bounded.disallowed_label(&ok), None);
        assert_eq!(bounded.disallowed_label(&claim(&[])), None);
        let other_value = claim(&[("pool", "gpu")]);
        assert_eq!(bounded.disallowed_label(&other_value), Some("pool"));
        let other_key = claim(&[("pool", "sandbox"), ("tier", "gold")]);
        assert_eq!(bounded.disallowed_label(&other_key), Some("tier"));
        let free = table.authenticate("t-c").unwrap();
        assert_eq!(free.disallowed_label(&other_key), None, "no labels: any");
        let user = row("t-u", "ada", "user") + "labels = { pool = \"x\" }\n";
        let err = format!("{:#}", TokenTable::parse(&user).unwrap_err());
        assert!(err.contains("tokens[0].labels"), "{err}");
    }

    #[test]
    fn a_budget_is_read_per_principal_and_a_malformed_one_is_refused_naming_its_key() {
        let text = row("t-a", "ada", "user")
            + "budget = { cost = \"25.00\", currency = \"USD\", tokens = 1000, period = \"month\" }\n"
            + &row("t-b", "bob", "user")
            + "budget = { tokens = 5 }\n"
            + &row("t-c", "cy", "user");
        let table = TokenTable::parse(&text).unwrap();
        let ada = table.budget("ada").unwrap();
        assert_eq!(ada.cost, Some((25_000_000, "USD".to_owned())));
        assert_eq!(ada.tokens, Some(1000));
        let bob = table.budget("bob").unwrap();
        assert_eq!((bob.tokens, bob.period), (Some(5), Period::Month));
        assert_eq!(table.budget("cy"), None);
        let cases: &[(&str, &str)] = &[
            (
                "budget = { cost = \"25,00\", currency = \"USD\" }",
                "tokens[0].budget.cost",
            ),
            (
                "budget = { cost = \"-1\", currency = \"USD\" }",
                "tokens[0].budget.cost",
            ),
            ("budget = { cost = \"1\" }", "tokens[0].budget.currency"),
            (
                "budget = { cost = \"1\", currency = \"U S\" }",
                "tokens[0].budget.currency",
            ),
            (
                "budget = { tokens = 5, period = \"year\" }",
                "tokens[0].budget.period",
            ),
            ("budget = { tokens = -5 }", "line 5"),
            ("budget = { }", "tokens[0].budget must set"),
            (
                "budget = { tokens = 5, spend = 1 }",
                "unknown field `spend`",
            ),
        ];
        for (line, needle) in cases {
            let text = row("x", "a", "user") + line + "\n";
            let err = format!("{:#}", TokenTable::parse(&text).unwrap_err());
            assert!(err.contains(needle), "{line:?} → {err}");
        }
        let runtime = row("x", "r", "runtime") + "budget = { tokens = 5 }\n";
        let err = format!("{:#}", TokenTable::parse(&runtime).unwrap_err());
        assert!(err.contains("tokens[0].budget"), "{err}");
        let disagree = row("x", "a", "user")
            + "budget = { tokens = 5 }\n"
            + &row("y", "a", "user")
            + "budget = { tokens = 6 }\n";
        let err = format!("{:#}", TokenTable::parse(&disagree).unwrap_err());
        assert!(err.contains("tokens[1].budget differs"), "{err}");
    }

    #[test]
    fn a_principal_id_is_bounded_and_printable() {
        check_principal("ada@example.com").unwrap();
        check_principal(&"a".repeat(MAX_PRINCIPAL_BYTES)).unwrap();
        assert!(check_principal(&"a".repeat(MAX_PRINCIPAL_BYTES + 1)).is_err());
        assert!(check_principal("a\u{7}b").is_err());
        assert!(check_principal("").is_err());
    }
}

//! [`MethodPattern`]: which methods a rule or an exemption covers.

use std::{fmt, str::FromStr};

/// A set of methods: one method (`pkg.Service/Method`), every method of a service
/// (`pkg.Service/*`, or `pkg.Service/` as [`for_methods`](crate::intercept::for_methods)
/// writes it), or every method (`*`).
///
/// ```
/// use rpc_core::auth::MethodPattern;
///
/// let reads: MethodPattern = "kv.v1.KeyValue/*".parse().unwrap();
/// assert!(reads.matches("kv.v1.KeyValue/Get"));
/// assert!(!reads.matches("kv.v1.KeyValueAdmin/Get"));
/// assert!("kv.v1.KeyValue/Get*".parse::<MethodPattern>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MethodPattern(Kind);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Kind {
    /// `*`.
    Any,
    /// `pkg.Service/*`: holds `pkg.Service/`.
    Service(String),
    /// `pkg.Service/Method`.
    Exact(String),
}

impl MethodPattern {
    /// Every method.
    pub fn any() -> MethodPattern {
        MethodPattern(Kind::Any)
    }

    /// Parses `*`, `pkg.Service/*`, `pkg.Service/` or `pkg.Service/Method`. Anything
    /// else (no `/`, an empty part, a `*` elsewhere, a second `/`) is an error, so
    /// that a typo is not a rule that silently matches nothing.
    pub fn parse(pattern: &str) -> Result<MethodPattern, InvalidMethodPattern> {
        let invalid = |reason: &str| InvalidMethodPattern {
            pattern: pattern.to_owned(),
            reason: reason.to_owned(),
        };
        if pattern == "*" {
            return Ok(MethodPattern(Kind::Any));
        }
        let (service, method) = pattern
            .split_once('/')
            .ok_or_else(|| invalid("expected `pkg.Service/Method`, `pkg.Service/*` or `*`"))?;
        if service.is_empty() {
            return Err(invalid("the service name is empty"));
        }
        if service.contains('*') {
            return Err(invalid(
                "`*` may only stand for a whole method or everything",
            ));
        }
        if method.contains('/') {
            return Err(invalid("more than one `/`"));
        }
        match method {
            "" | "*" => Ok(MethodPattern(Kind::Service(format!("{service}/")))),
            m if m.contains('*') => Err(invalid(
                "`*` may only stand for a whole method or everything",
            )),
            _ => Ok(MethodPattern(Kind::Exact(pattern.to_owned()))),
        }
    }

    /// Whether `method` (`pkg.Service/Method`) is one of this pattern's.
    pub fn matches(&self, method: &str) -> bool {
        match &self.0 {
            Kind::Any => true,
            Kind::Service(prefix) => method.starts_with(prefix.as_str()),
            Kind::Exact(exact) => method == exact,
        }
    }
}

impl FromStr for MethodPattern {
    type Err = InvalidMethodPattern;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MethodPattern::parse(s)
    }
}

impl fmt::Display for MethodPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Any => f.write_str("*"),
            Kind::Service(prefix) => write!(f, "{prefix}*"),
            Kind::Exact(exact) => f.write_str(exact),
        }
    }
}

impl fmt::Debug for MethodPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MethodPattern({self})")
    }
}

/// Why a string is not a [`MethodPattern`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidMethodPattern {
    pattern: String,
    reason: String,
}

impl fmt::Display for InvalidMethodPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid method pattern {:?}: {}",
            self.pattern, self.reason
        )
    }
}

impl std::error::Error for InvalidMethodPattern {}

/// Parses every pattern, panicking on an invalid one: for builder methods that take
/// patterns written in the program.
#[track_caller]
pub(crate) fn parse_all(patterns: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<MethodPattern> {
    patterns
        .into_iter()
        .map(|p| MethodPattern::parse(p.as_ref()).unwrap_or_else(|err| panic!("{err}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> MethodPattern {
        MethodPattern::parse(s).unwrap()
    }

    #[test]
    fn star_matches_every_method() {
        assert!(p("*").matches("a.B/C"));
        assert!(p("*").matches(""));
        assert_eq!(p("*"), MethodPattern::any());
    }

    #[test]
    fn a_service_pattern_matches_that_service_only() {
        for pattern in ["kv.v1.KeyValue/*", "kv.v1.KeyValue/"] {
            let pattern = p(pattern);
            assert!(pattern.matches("kv.v1.KeyValue/Get"));
            assert!(pattern.matches("kv.v1.KeyValue/Put"));
            assert!(
                !pattern.matches("kv.v1.KeyValueAdmin/Get"),
                "no prefix of a name"
            );
            assert!(!pattern.matches("kv.v1.KeyValue"));
            assert!(!pattern.matches("other.S/Get"));
            assert_eq!(pattern.to_string(), "kv.v1.KeyValue/*");
        }
    }

    #[test]
    fn an_exact_pattern_matches_one_method() {
        let pattern = p("kv.v1.KeyValue/Get");
        assert!(pattern.matches("kv.v1.KeyValue/Get"));
        assert!(!pattern.matches("kv.v1.KeyValue/GetMany"));
        assert!(!pattern.matches("kv.v1.KeyValue/Ge"));
        assert!(!pattern.matches("kv.v1.KeyValue/get"), "case matters");
    }

    #[test]
    fn malformed_patterns_are_errors() {
        for bad in [
            "",
            "kv.v1.KeyValue",
            "/Get",
            "kv.*/Get",
            "*/Get",
            "kv.v1.KeyValue/Get*",
            "kv.v1.KeyValue/*/x",
            "**",
        ] {
            let err = MethodPattern::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    #[should_panic(expected = "invalid method pattern \"kv.Get\"")]
    fn builder_patterns_panic_when_malformed() {
        parse_all(["kv.v1.KeyValue/Get", "kv.Get"]);
    }
}

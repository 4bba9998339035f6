//! [`TokenSet`]: a fixed set of bearer tokens, each naming a [`Principal`], built in
//! code or loaded from a tokens file (its format is in [`TokenSet`]'s docs).

use std::{
    fmt,
    path::Path,
    sync::{Arc, PoisonError, RwLock},
};

use super::Principal;

/// Bearer tokens and the principal each one stands for: the static form of
/// [`BearerLayer`](super::BearerLayer).
///
/// A token is checked against every token of the set with a comparison whose time
/// does not depend on where the bytes differ, so response times do not reveal how
/// much of a guess was right. (That is a scan: sets of thousands of tokens belong in a
/// validator closure backed by a real store.)
///
/// ```
/// use rpc_core::auth::{Principal, TokenSet};
///
/// let tokens = TokenSet::parse("
///     # token  name   roles
///     s3cret   alice  reader,writer
///     t0ken    bob
/// ").unwrap();
/// assert_eq!(tokens.lookup("s3cret").unwrap().roles(), ["reader", "writer"]);
/// assert!(tokens.lookup("nope").is_none());
///
/// let same = TokenSet::new().with("t0ken", Principal::new("bob"));
/// assert_eq!(same.lookup("t0ken").unwrap().name(), "bob");
/// ```
///
/// # The tokens file (for a server's `--auth-tokens FILE`)
///
/// One token per line, as whitespace-separated fields:
///
/// ```text
/// # token                name      roles (optional, comma-separated)
/// 6f1d0c2e9a7b4f35      alice     reader,writer
/// 0b7e44c1d2a9e8f6      monitor
/// 9c3a7d1e5f2b8046      deploy    admin   # the CI pipeline
/// ```
///
/// - `token`: printable ASCII without spaces (what follows `Bearer ` in the
///   `authorization` metadata), not starting with `#`. Use long random tokens (32 hex
///   digits or more): they are passwords.
/// - `name`: the [`Principal::name`].
/// - `roles`: optional, comma-separated [`Principal::roles`], no spaces, none empty.
///
/// Blank lines are ignored, and a field starting with `#` begins a comment that runs
/// to the end of the line (so a whole line starting with `#` is one). Anything else is
/// an error naming the line: a missing name, a fourth field, an empty role, a token
/// that is not printable ASCII, a token listed twice.
#[derive(Clone, Default)]
pub struct TokenSet {
    entries: Vec<(Box<[u8]>, Arc<Principal>)>,
}

impl TokenSet {
    /// An empty set (which accepts no token).
    pub fn new() -> TokenSet {
        TokenSet::default()
    }

    /// Adds `token` for `principal` (replacing what the token stood for before).
    pub fn insert(&mut self, token: impl AsRef<str>, principal: Principal) {
        let token = token.as_ref().as_bytes();
        let principal = Arc::new(principal);
        match self.entries.iter_mut().find(|(t, _)| **t == *token) {
            Some(entry) => entry.1 = principal,
            None => self.entries.push((token.into(), principal)),
        }
    }

    /// [`insert`](Self::insert) as a builder.
    pub fn with(mut self, token: impl AsRef<str>, principal: Principal) -> TokenSet {
        self.insert(token, principal);
        self
    }

    /// The principal `token` stands for.
    pub fn lookup(&self, token: &str) -> Option<Arc<Principal>> {
        let mut found = None;
        // No early exit: every entry is compared whatever matched.
        for (candidate, principal) in &self.entries {
            if constant_time_eq(candidate, token.as_bytes()) && found.is_none() {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Parses a tokens file's text (the format is in the [type docs](TokenSet)).
    pub fn parse(text: &str) -> Result<TokenSet, TokensFileError> {
        let mut set = TokenSet::new();
        let mut lines_of: Vec<usize> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let error = |reason: String| TokensFileError {
                path: None,
                line: Some(number),
                reason,
                source: None,
            };
            let fields: Vec<&str> = line
                .split_ascii_whitespace()
                .take_while(|field| !field.starts_with('#'))
                .collect();
            let (token, name, roles) = match fields[..] {
                [] => continue,
                // No part of a token is shown (a line that is a bare secret, a
                // mounted secret file, is all token): the line number says which.
                [_token] => {
                    return Err(error(
                        "the token has no name (expected `token name [role,role]`)".into(),
                    ))
                }
                [token, name] => (token, name, None),
                [token, name, roles] => (token, name, Some(roles)),
                // Not shown either: two lines run together put a token there.
                [_, _, _, _, ..] => {
                    return Err(error(format!(
                        "{} fields where at most 3 go (expected `token name [role,role]`; \
                         roles are separated by commas, without spaces)",
                        fields.len()
                    )))
                }
            };
            if let Some(bad) = token.bytes().find(|b| !b.is_ascii_graphic()) {
                return Err(error(format!(
                    "the token has byte 0x{bad:02x}; tokens are printable ASCII"
                )));
            }
            let mut principal = Principal::new(name);
            if let Some(roles) = roles {
                for role in roles.split(',') {
                    if role.is_empty() {
                        return Err(error(format!("empty role in {roles:?}")));
                    }
                    principal = principal.with_role(role);
                }
            }
            if let Some(at) = set
                .entries
                .iter()
                .position(|(t, _)| **t == *token.as_bytes())
            {
                return Err(error(format!(
                    "the token is already on line {}",
                    lines_of[at]
                )));
            }
            set.entries
                .push((token.as_bytes().into(), Arc::new(principal)));
            lines_of.push(number);
        }
        Ok(set)
    }

    /// Reads and parses a tokens file (for a server's `--auth-tokens FILE`).
    pub fn load(path: impl AsRef<Path>) -> Result<TokenSet, TokensFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|err| TokensFileError {
            path: Some(path.display().to_string()),
            line: None,
            reason: err.to_string(),
            source: Some(Arc::new(err)),
        })?;
        TokenSet::parse(&text).map_err(|mut err| {
            err.path = Some(path.display().to_string());
            err
        })
    }
}

/// A [`TokenSet`] that can be replaced while a server uses it: give it to
/// [`BearerLayer::shared`](super::BearerLayer::shared), and [`replace`](Self::replace)
/// the set (on SIGHUP, say, from a tokens file edited to add or revoke a token). Calls
/// that arrive afterwards are checked against the new set; calls already past the
/// check keep the principal they were given.
///
/// ```
/// use rpc_core::auth::{BearerLayer, Principal, SharedTokens, TokenSet};
///
/// let tokens = SharedTokens::new(TokenSet::new().with("old", Principal::new("alice")));
/// let layer = BearerLayer::shared(tokens.clone());
/// tokens.replace(TokenSet::new().with("new", Principal::new("alice")));
/// assert!(tokens.lookup("old").is_none());
/// assert_eq!(tokens.lookup("new").unwrap().name(), "alice");
/// # drop(layer);
/// ```
#[derive(Clone, Default)]
pub struct SharedTokens(Arc<RwLock<Arc<TokenSet>>>);

impl SharedTokens {
    /// Shares `tokens`.
    pub fn new(tokens: TokenSet) -> SharedTokens {
        SharedTokens(Arc::new(RwLock::new(Arc::new(tokens))))
    }

    /// Puts `tokens` in place of the set in use, for every layer sharing it.
    pub fn replace(&self, tokens: TokenSet) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tokens);
    }

    /// The set in use now.
    pub fn current(&self) -> Arc<TokenSet> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The principal `token` stands for in the set in use now.
    pub fn lookup(&self, token: &str) -> Option<Arc<Principal>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .lookup(token)
    }
}

impl fmt::Debug for SharedTokens {
    /// Names the principals of the set in use, never the tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedTokens")
            .field(&self.current())
            .finish()
    }
}

impl fmt::Debug for TokenSet {
    /// Names the principals, never the tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSet")
            .field(
                "principals",
                &self
                    .entries
                    .iter()
                    .map(|(_, p)| p.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Compares two byte strings in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Why a tokens file could not be read: the file (if it was read from one), the line
/// (1-based; `None` when the file could not be read at all) and the reason.
#[derive(Clone, Debug)]
pub struct TokensFileError {
    path: Option<String>,
    line: Option<usize>,
    reason: String,
    source: Option<Arc<std::io::Error>>,
}

impl TokensFileError {
    /// The line at fault, 1-based; `None` if the file could not be read.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

impl fmt::Display for TokensFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, self.line) {
            (Some(path), Some(line)) => write!(f, "{path}:{line}: {}", self.reason),
            (Some(path), None) => write!(f, "cannot read tokens file {path}: {}", self.reason),
            (None, Some(line)) => write!(f, "tokens file line {line}: {}", self.reason),
            (None, None) => write!(f, "tokens file: {}", self.reason),
        }
    }
}

impl std::error::Error for TokensFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|err| err as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_file_with_comments_roles_and_blank_lines() {
        let set = TokenSet::parse(
            "# token name roles\n\
             \n\
             \tabc123   alice   reader,writer\n\
             def456 bob # no roles\n   \n\
             # ghi789 carol\n\
             x#y z admin\n",
        )
        .unwrap();
        assert_eq!(set.len(), 3);
        let alice = set.lookup("abc123").unwrap();
        assert_eq!(alice.name(), "alice");
        assert_eq!(alice.roles(), ["reader", "writer"]);
        let bob = set.lookup("def456").unwrap();
        assert_eq!(bob.name(), "bob");
        assert!(bob.roles().is_empty());
        assert!(set.lookup("ghi789").is_none(), "commented out");
        assert_eq!(set.lookup("x#y").unwrap().name(), "z", "`#` inside a token");
        assert!(set.lookup("abc12").is_none());
        assert!(set.lookup("abc1234").is_none());
        assert!(set.lookup("").is_none());
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        for (text, line, needle) in [
            ("ok alice\nlonelytoken\n", 2, "has no name"),
            ("a b c d\n", 1, "4 fields where at most 3 go"),
            ("a b reader, writer\n", 1, "4 fields where at most 3 go"),
            ("\n\na b reader,,writer\n", 3, "empty role"),
            ("a b ,\n", 1, "empty role"),
            ("tok\u{e9}n bob\n", 1, "printable ASCII"),
            ("same alice\n# x\nsame bob\n", 3, "already on line 1"),
        ] {
            let err = TokenSet::parse(text).unwrap_err();
            assert_eq!(err.line(), Some(line), "{text:?}: {err}");
            let shown = err.to_string();
            assert!(
                shown.starts_with(&format!("tokens file line {line}: ")),
                "{shown}"
            );
            assert!(shown.contains(needle), "{text:?}: {shown}");
        }
    }

    #[test]
    fn errors_do_not_show_whole_tokens() {
        // No part of one: not its first characters, not a token that two lines run
        // together put in a fourth field.
        for text in [
            "supersecret alice\nsupersecret bob\n",
            "supersecret\n",
            "TOK_A alice r TOK_B bob\n",
        ] {
            let err = TokenSet::parse(text).unwrap_err().to_string();
            for secret in ["supe", "TOK_"] {
                assert!(!err.contains(secret), "{text:?}: {err}");
            }
        }
        let set = TokenSet::new().with("supersecret", Principal::new("alice"));
        assert!(!format!("{set:?}").contains("supersecret"));
    }

    #[test]
    fn load_names_the_file() {
        let dir = std::env::temp_dir().join(format!("rpc-auth-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "good alice admin\nbad\n").unwrap();
        let err = TokenSet::load(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:2: the token has no name (expected `token name [role,role]`)",
                path.display()
            )
        );
        std::fs::write(&path, "good alice admin\n").unwrap();
        assert_eq!(TokenSet::load(&path).unwrap().len(), 1);
        std::fs::remove_file(&path).unwrap();
        let err = TokenSet::load(&path).unwrap_err();
        assert_eq!(err.line(), None);
        assert!(
            err.to_string().starts_with("cannot read tokens file"),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some());
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn insert_replaces_a_token() {
        let mut set = TokenSet::new().with("t", Principal::new("a"));
        set.insert("t", Principal::new("b"));
        assert_eq!(set.len(), 1);
        assert_eq!(set.lookup("t").unwrap().name(), "b");
        assert!(TokenSet::new().is_empty());
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}

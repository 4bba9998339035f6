//! [`Principal`]: who a call's credentials say is calling.

use std::{collections::BTreeMap, fmt};

/// Who a call's credentials (a bearer token, say) say is calling: a name, roles, and
/// free-form claims. An authentication layer such as
/// [`BearerLayer`](super::BearerLayer) sets it on the call
/// ([`ServerCall::principal`](crate::server::ServerCall::principal)); the
/// [`AuthorizeLayer`](super::AuthorizeLayer) and handlers
/// ([`Request::principal`](crate::Request::principal)) read it.
///
/// ```
/// use rpc_core::auth::Principal;
///
/// let alice = Principal::new("alice").with_role("reader").with_claim("tenant", "acme");
/// assert!(alice.has_role("reader"));
/// assert_eq!(alice.claim("tenant"), Some("acme"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Principal {
    name: String,
    roles: Vec<String>,
    claims: BTreeMap<String, String>,
}

impl Principal {
    /// A principal called `name`, with no roles and no claims.
    pub fn new(name: impl Into<String>) -> Principal {
        Principal {
            name: name.into(),
            ..Principal::default()
        }
    }

    /// Adds a role.
    pub fn with_role(mut self, role: impl Into<String>) -> Principal {
        let role = role.into();
        if !self.roles.contains(&role) {
            self.roles.push(role);
        }
        self
    }

    /// Adds several roles.
    pub fn with_roles(self, roles: impl IntoIterator<Item = impl Into<String>>) -> Principal {
        roles.into_iter().fold(self, Principal::with_role)
    }

    /// Sets a claim (replacing an earlier value under `key`).
    pub fn with_claim(mut self, key: impl Into<String>, value: impl Into<String>) -> Principal {
        self.claims.insert(key.into(), value.into());
        self
    }

    /// The name (a user, a service account).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The roles, in the order they were added.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// Whether the principal has `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }

    /// The claim under `key`.
    pub fn claim(&self, key: &str) -> Option<&str> {
        self.claims.get(key).map(String::as_str)
    }

    /// Every claim, by key.
    pub fn claims(&self) -> impl Iterator<Item = (&str, &str)> {
        self.claims.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Principal");
        d.field("name", &self.name);
        if !self.roles.is_empty() {
            d.field("roles", &self.roles);
        }
        if !self.claims.is_empty() {
            d.field("claims", &self.claims);
        }
        d.finish()
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

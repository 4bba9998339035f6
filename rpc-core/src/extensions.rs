//! [`Extensions`]: values of any type, one per type, that travel with a call inside the
//! server, from a tower layer to the handler.
//!
//! An authentication layer that found a user id in a token, or a layer that picked the
//! tenant, puts it in [`ServerCall::extensions`](crate::server::ServerCall::extensions);
//! the generated dispatcher moves the extensions into the handler's
//! [`Request`](crate::Request), where [`Request::extensions`](crate::Request::extensions)
//! finds it by type. Extensions never go on the wire.
//!
//! ```
//! use rpc_core::{server::ServerCall, Extensions};
//! use tower::util::MapRequestLayer;
//!
//! #[derive(Clone, Debug, PartialEq)]
//! struct Tenant(String);
//!
//! // A server layer: `Server::builder().layer(tenant)`.
//! let tenant = MapRequestLayer::new(|mut call: ServerCall| {
//!     let name = call.metadata.get_str("x-tenant").unwrap_or("default").to_owned();
//!     call.extensions.insert(Tenant(name));
//!     call
//! });
//! # drop(tenant);
//! // In the handler: `request.extensions().get::<Tenant>()`.
//! let mut extensions = Extensions::new();
//! extensions.insert(Tenant("acme".into()));
//! assert_eq!(extensions.get::<Tenant>(), Some(&Tenant("acme".into())));
//! ```
//!
//! Same idea as `http::Extensions` (which tonic's requests carry), without the
//! dependency: a map from [`TypeId`] to a boxed value, allocated on the first insert,
//! so a call whose layers insert nothing pays one null pointer.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    fmt,
    hash::{BuildHasherDefault, Hasher},
};

/// A type map: at most one value of each type. Values are `Clone + Send + Sync`, so
/// calls and requests that carry them stay `Clone`, `Send` and `Sync`.
///
/// Empty, it is one null pointer and allocates nothing; cloning an empty one allocates
/// nothing either.
#[derive(Default)]
pub struct Extensions {
    // Boxed so that an empty map (nearly every call) costs one pointer, not a HashMap.
    map: Option<Box<AnyMap>>,
}

type AnyMap = HashMap<TypeId, Box<dyn AnyClone>, BuildHasherDefault<TypeIdHasher>>;

impl Extensions {
    /// An empty map (no allocation).
    pub fn new() -> Extensions {
        Extensions::default()
    }

    /// Inserts `value`, returning the value of the same type it replaces.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) -> Option<T> {
        self.map
            .get_or_insert_with(Box::default)
            .insert(TypeId::of::<T>(), Box::new(value))
            .and_then(|old| old.into_any().downcast().ok().map(|old| *old))
    }

    /// The value of type `T`, if one was inserted.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.map
            .as_ref()?
            .get(&TypeId::of::<T>())
            .and_then(|value| (**value).as_any().downcast_ref())
    }

    /// The value of type `T`, mutably.
    pub fn get_mut<T: Send + Sync + 'static>(&mut self) -> Option<&mut T> {
        self.map
            .as_mut()?
            .get_mut(&TypeId::of::<T>())
            .and_then(|value| (**value).as_any_mut().downcast_mut())
    }

    /// Takes the value of type `T` out.
    pub fn remove<T: Send + Sync + 'static>(&mut self) -> Option<T> {
        self.map
            .as_mut()?
            .remove(&TypeId::of::<T>())
            .and_then(|old| old.into_any().downcast().ok().map(|old| *old))
    }

    /// Removes every value.
    pub fn clear(&mut self) {
        self.map = None;
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.map.as_ref().is_none_or(|map| map.is_empty())
    }

    /// How many values there are.
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |map| map.len())
    }

    /// Moves every value of `other` in, replacing values of the same types.
    pub fn extend(&mut self, other: Extensions) {
        let Some(other) = other.map else {
            return;
        };
        match &mut self.map {
            Some(map) => map.extend(*other),
            None => self.map = Some(other),
        }
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The values need not be `Debug`: only how many there are.
        f.debug_struct("Extensions")
            .field("len", &self.len())
            .finish()
    }
}

/// A value that can be cloned behind `dyn` and seen as `Any`.
trait AnyClone: Any + Send + Sync {
    fn clone_box(&self) -> Box<dyn AnyClone>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Clone + Send + Sync + 'static> AnyClone for T {
    fn clone_box(&self) -> Box<dyn AnyClone> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

// By hand rather than `Clone` for `Box<dyn AnyClone>`: that box would then be an
// `AnyClone` itself, and method calls on it would find the box instead of the value.
impl Clone for Extensions {
    fn clone(&self) -> Self {
        Extensions {
            map: self.map.as_ref().map(|map| {
                Box::new(
                    map.iter()
                        .map(|(&id, value)| (id, (**value).clone_box()))
                        .collect(),
                )
            }),
        }
    }
}

/// `TypeId`s are already hashes: pass the one `u64` they write through.
#[derive(Default)]
struct TypeIdHasher(u64);

impl Hasher for TypeIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // `TypeId` writes a u64 (or u128) through `write_u64`/`write_u128`; anything else
        // is folded in, so this stays a correct (if slower) hasher.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct UserId(u64);

    #[derive(Clone, Debug, PartialEq)]
    struct Tenant(&'static str);

    #[test]
    fn empty_allocates_nothing_and_finds_nothing() {
        let ext = Extensions::new();
        assert!(ext.map.is_none());
        assert!(ext.is_empty());
        assert_eq!(ext.get::<UserId>(), None);
        assert!(ext.clone().map.is_none());
        assert_eq!(
            std::mem::size_of::<Extensions>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn one_value_per_type() {
        let mut ext = Extensions::new();
        assert_eq!(ext.insert(UserId(1)), None);
        assert_eq!(ext.insert(Tenant("acme")), None);
        assert_eq!(ext.insert(UserId(2)), Some(UserId(1)));
        assert_eq!(ext.len(), 2);
        assert_eq!(ext.get::<UserId>(), Some(&UserId(2)));
        ext.get_mut::<UserId>().unwrap().0 = 3;
        let copy = ext.clone();
        assert_eq!(ext.remove::<UserId>(), Some(UserId(3)));
        assert_eq!(ext.get::<UserId>(), None);
        assert_eq!(copy.get::<UserId>(), Some(&UserId(3)), "clones are deep");
        assert_eq!(copy.get::<Tenant>(), Some(&Tenant("acme")));
        let mut other = Extensions::new();
        other.extend(copy);
        assert_eq!(other.len(), 2);
        other.clear();
        assert!(other.is_empty());
        assert_eq!(format!("{ext:?}"), "Extensions { len: 1 }");
    }
}

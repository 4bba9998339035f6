//! protoc's lookup of compound type names (`common.dns.Config`), where the one protox
//! uses (prost-reflect 0.16) differs.
//!
//! Both look a relative name's first part up from the innermost scope outward
//! (`a.b.c.common`, `a.b.common`, `a.common`, `common`) and resolve the rest inside the
//! first scope where it is found. protoc takes a scope only if the file can see it: a
//! message, enum or service of the file itself, of a file it imports, or of a file
//! those re-export with `import public`; a package that one of those files declares
//! (or is inside of). prost-reflect takes any it knows: a package declared by a file
//! imported only indirectly, or by another root of the same `compile` that nothing
//! here imports, captures the name, and a file protoc accepts is refused ("resolves
//! to 'a.b.common.dns.Config', which is not defined"), or not, depending on the order
//! of the roots (from a review: envoy's `clusters/dynamic_forward_proxy/v3/cluster.proto`
//! writes `common.dynamic_forward_proxy.v3.DnsCacheConfig`, and a package
//! `envoy.extensions.clusters.common` comes in through an import of an import).
//!
//! [`protoc_names`] rewrites such a name, as written in a file handed to protox, to
//! the full name protoc resolves it to (`.a.common.dns.Config`), which both read
//! alike (or refuse alike: a name protoc does not find either is refused saying where
//! protoc looked); a name both resolve alike is left as written. The generated code and the
//! descriptor sets do not change: the compiler writes every resolved name in full.

use std::collections::HashSet;

use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};

/// What one file declares that a name's first part can be looked up in.
#[derive(Debug, Default)]
pub(crate) struct Scopes {
    /// Its package (`""` for none).
    package: String,
    /// The full names of its messages, enums and services, nested ones included.
    types: HashSet<String>,
}

impl Scopes {
    /// The scopes `file` declares.
    pub(crate) fn of(file: &FileDescriptorProto) -> Scopes {
        let package = file.package().to_owned();
        let mut types = HashSet::new();
        for message in &file.message_type {
            add_message(&join(&package, message.name()), message, &mut types);
        }
        for name in file.enum_type.iter().map(|e| e.name()) {
            types.insert(join(&package, name));
        }
        for name in file.service.iter().map(|s| s.name()) {
            types.insert(join(&package, name));
        }
        Scopes { package, types }
    }

    /// Whether `name` is one of these scopes: a type declared here, or this file's
    /// package or one it is inside of.
    fn has(&self, name: &str) -> bool {
        self.types.contains(name) || in_package(&self.package, name)
    }

    /// Every scope name this file adds to what the compiler knows: its types, its
    /// package and the packages it is inside of.
    pub(crate) fn names(&self) -> impl Iterator<Item = String> + '_ {
        let packages = self
            .package
            .match_indices('.')
            .map(|(i, _)| self.package[..i].to_owned())
            .chain((!self.package.is_empty()).then(|| self.package.clone()));
        self.types.iter().cloned().chain(packages)
    }
}

fn add_message(full: &str, message: &DescriptorProto, types: &mut HashSet<String>) {
    types.insert(full.to_owned());
    for nested in &message.nested_type {
        add_message(&join(full, nested.name()), nested, types);
    }
    for name in message.enum_type.iter().map(|e| e.name()) {
        types.insert(join(full, name));
    }
}

/// Whether `package` is `name` or inside it (`a.b.c` is inside `a.b`).
fn in_package(package: &str, name: &str) -> bool {
    package
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        && !name.is_empty()
}

fn join(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

/// Whether `file` writes any compound relative type name (`a.B`, not `.a.B` nor `B`):
/// the only ones whose lookup can differ.
pub(crate) fn has_compound_names(file: &FileDescriptorProto) -> bool {
    let mut any = false;
    let mut file = file.clone();
    each_name(&mut file, &mut |_, name| {
        any |= is_compound(name);
    });
    any
}

fn is_compound(name: &str) -> bool {
    !name.starts_with('.') && name.contains('.')
}

/// `file` with each compound relative type name that protoc and prost-reflect resolve
/// differently written in full, as protoc resolves it; `None` if there is none.
/// `visible` are the scopes of the file itself, its imports and what they re-export;
/// `known` is every scope name the compiler knows when it adds this file (each
/// file read so far).
pub(crate) fn protoc_names(
    file: &FileDescriptorProto,
    visible: &[&Scopes],
    known: &HashSet<String>,
) -> Option<FileDescriptorProto> {
    let mut mended = file.clone();
    let mut changed = false;
    each_name(&mut mended, &mut |scope, name| {
        if !is_compound(name) {
            return;
        }
        let first = name.split('.').next().unwrap_or_default();
        let parents = || {
            std::iter::successors(Some(scope), |s| s.rfind('.').map(|i| &s[..i]))
                .chain((!scope.is_empty()).then_some(""))
        };
        // prost-reflect: the first scope where the first part names any scope it
        // knows (none: "not defined").
        let theirs = parents().find(|parent| known.contains(&join(parent, first)));
        // protoc: the first where it names one this file sees; failing that, the
        // name from the top.
        let ours = parents()
            .find(|parent| {
                let candidate = join(parent, first);
                visible.iter().any(|scopes| scopes.has(&candidate))
            })
            .unwrap_or("");
        // Where the two differ. A name protoc does not find either is refused either
        // way; written in full, the error names where protoc looked, not a package
        // the file cannot see.
        if theirs != Some(ours) {
            let full = join(ours, name);
            *name = format!(".{full}");
            changed = true;
        }
    });
    changed.then_some(mended)
}

/// Calls `f` with each type name `file` writes (field types, extendees, method
/// request and response types) and the scope it is looked up from: the message,
/// service or package it is written in.
fn each_name(file: &mut FileDescriptorProto, f: &mut impl FnMut(&str, &mut String)) {
    let package = file.package().to_owned();
    for message in &mut file.message_type {
        let full = join(&package, message.name());
        each_name_in(&full, message, f);
    }
    for extension in &mut file.extension {
        field_names(&package, extension, f);
    }
    for service in &mut file.service {
        let full = join(&package, service.name());
        for method in &mut service.method {
            for name in [&mut method.input_type, &mut method.output_type]
                .into_iter()
                .flatten()
            {
                f(&full, name);
            }
        }
    }
}

fn each_name_in(full: &str, message: &mut DescriptorProto, f: &mut impl FnMut(&str, &mut String)) {
    for field in message.field.iter_mut().chain(&mut message.extension) {
        field_names(full, field, f);
    }
    for nested in &mut message.nested_type {
        let nested_full = join(full, nested.name());
        each_name_in(&nested_full, nested, f);
    }
}

fn field_names(
    scope: &str,
    field: &mut FieldDescriptorProto,
    f: &mut impl FnMut(&str, &mut String),
) {
    for name in [&mut field.type_name, &mut field.extendee]
        .into_iter()
        .flatten()
    {
        f(scope, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(package: &str, message: &str, field_type: &str) -> FileDescriptorProto {
        FileDescriptorProto {
            package: Some(package.into()),
            message_type: vec![DescriptorProto {
                name: Some(message.into()),
                field: vec![FieldDescriptorProto {
                    name: Some("f".into()),
                    type_name: Some(field_type.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn type_name(file: &FileDescriptorProto) -> &str {
        file.message_type[0].field[0].type_name()
    }

    #[test]
    fn a_package_the_file_cannot_see_does_not_capture_a_name() {
        let user = file("p.clusters.dfp", "Cluster", "common.dfp.Cfg");
        let common = file("p.common.dfp", "Cfg", "string");
        let hidden = file("p.clusters.common.dns", "Dns", "string");
        let scopes = [Scopes::of(&user), Scopes::of(&common), Scopes::of(&hidden)];
        let known: HashSet<String> = scopes.iter().flat_map(Scopes::names).collect();
        // The file sees itself and `common`; the package of `hidden` comes in
        // through another file's import.
        let mended = protoc_names(&user, &[&scopes[0], &scopes[1]], &known).unwrap();
        assert_eq!(type_name(&mended), ".p.common.dfp.Cfg");
        // Seen, it captures the name, as in protoc (which then refuses it).
        let all = [&scopes[0], &scopes[1], &scopes[2]];
        assert!(protoc_names(&user, &all, &known).is_none());
    }

    #[test]
    fn names_both_resolve_alike_are_left_as_written() {
        let user = file("a.b", "M", "c.T");
        let c = file("a.c", "T", "string");
        let scopes = [Scopes::of(&user), Scopes::of(&c)];
        let known: HashSet<String> = scopes.iter().flat_map(Scopes::names).collect();
        assert!(protoc_names(&user, &[&scopes[0], &scopes[1]], &known).is_none());
        assert!(has_compound_names(&user));
        assert!(!has_compound_names(&file("a", "M", ".a.c.T")));
        assert!(!has_compound_names(&file("a", "M", "T")));
    }

    #[test]
    fn packages_contain_their_subpackages_only() {
        assert!(in_package("a.b.c", "a.b"));
        assert!(in_package("a.b", "a.b"));
        assert!(!in_package("a.bc", "a.b"));
        assert!(!in_package("a", ""));
    }
}

//! What generated code knows about each method: its wire name and whether it is safe
//! to repeat.

/// Whether repeating a call can change the outcome: protobuf's
/// `option idempotency_level`, read from the `.proto` by the code generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Idempotency {
    /// The default: the method may have side effects; repeating it is not safe.
    #[default]
    Unknown,
    /// `NO_SIDE_EFFECTS`: the method only reads.
    NoSideEffects,
    /// `IDEMPOTENT`: repeating the call has the same effect as making it once.
    Idempotent,
}

impl Idempotency {
    /// Whether the method may be retried after the request may have reached the server.
    pub fn is_safe_to_repeat(self) -> bool {
        !matches!(self, Idempotency::Unknown)
    }
}

/// A method as generated code describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MethodDescriptor {
    /// Fully qualified service name: `package.Service`.
    pub service: &'static str,
    /// Method name as in the `.proto`: `Get`.
    pub method: &'static str,
    /// The name on the wire: `package.Service/Method`.
    pub path: &'static str,
    /// From `option idempotency_level`.
    pub idempotency: Idempotency,
}

//! Naming snapshots: `REF` arguments are a ref name or a snapshot id (a
//! unique prefix of at least 4 hex digits is enough).

use crate::error::{Error, Result};
use crate::hash::{is_hex_prefix, Hash};
use crate::object::check_ref_name;
use crate::store::Remote;

/// Resolves `spec` to a snapshot id. Costs one GET for a ref, nothing for
/// a full id, one LIST for a short id.
pub async fn resolve(remote: &Remote, spec: &str) -> Result<Hash> {
    if let Ok(h) = spec.parse::<Hash>() {
        return Ok(h);
    }
    if check_ref_name(spec).is_ok() {
        if let Some((v, _)) = remote.read_ref(spec).await? {
            return Ok(v.snapshot);
        }
    }
    if is_hex_prefix(spec) && spec.len() >= 4 {
        let found = remote.snapshots_with_prefix(spec).await?;
        return match found.as_slice() {
            [one] => Ok(*one),
            [] => Err(Error::NotFound(format!(
                "no ref or snapshot named {spec:?}; see `mado log` for snapshot ids"
            ))),
            many => Err(Error::User(format!(
                "{spec:?} matches {} snapshots; give more digits ({} …)",
                many.len(),
                many.iter()
                    .take(3)
                    .map(|h| h.short())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    Err(Error::NotFound(format!(
        "no ref named {spec:?}; list refs with `mado log` or import one with `mado import-git`"
    )))
}

//! The single-writer lease of a workspace: taken and renewed by
//! compare-and-swap, released so another working copy can take it.
use super::working_copy::load_state;
use super::{now, ws_ref, LEASE_SECS};
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::object::Lease;
use crate::store::RefVersion;
use crate::store::Remote;
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;

/// The lease object of workspace `name` as stored, with its version (one
/// GET; `None`: no lease was ever taken). Read in a command's first round
/// trip beside the workspace's ref, it is [`take_lease_seen`]'s first read:
/// a held lease is refused before any work, and the second connection this
/// GET opens is ready for the next round trip's two GETs.
pub async fn read_lease(remote: &Remote, name: &str) -> Result<Seen> {
    remote.read_versioned(&remote.key(&crate::store::layout::lease(&ws_ref(name)?))).await
}

/// `Err(`[`Error::LeaseHeld`]`)` when another working copy keeps the lease
/// of workspace `name` (one GET): for a refusal that must come after the
/// lease's, which says more.
pub async fn check_lease_free(remote: &Remote, name: &str, steal: bool) -> Result<()> {
    let cur = read_lease(remote, name).await?;
    lease_expected(name, "", steal, &cur).map(|_| ())
}

/// A lease object as read: its bytes and version, or `None` if absent.
pub type Seen = Option<(Bytes, RefVersion)>;

/// Takes or renews the lease of workspace `name` for `holder`, starting
/// from `seen` (a [`read_lease`] made earlier; `None`: its own first GET):
/// one conditional PUT when nobody moved the lease since. A lost race
/// reads it again. A lease another holder keeps is refused with
/// [`Error::LeaseHeld`]; an expired one is taken only with `steal`; a
/// released one is free.
pub async fn take_lease_seen(remote: &Remote, name: &str, holder: &str, steal: bool, seen: Option<Seen>) -> Result<()> {
    take_lease_was(remote, name, holder, steal, seen).await.map(|_| ())
}

/// [`take_lease_seen`], saying whether `holder` already held the lease
/// (a renewal) rather than taking it now.
pub async fn take_lease_was(
    remote: &Remote,
    name: &str,
    holder: &str,
    steal: bool,
    seen: Option<Seen>,
) -> Result<bool> {
    take_lease_from(remote, name, holder, None, steal, seen).await
}

/// [`take_lease_was`], where a lease `from` holds is ours too: the same
/// copy under its new name (a workspace mounted again at another path).
pub async fn take_lease_from(
    remote: &Remote,
    name: &str,
    holder: &str,
    from: Option<&str>,
    steal: bool,
    seen: Option<Seen>,
) -> Result<bool> {
    let key = remote.key(&crate::store::layout::lease(&ws_ref(name)?));
    let mut seen = seen;
    for _ in 0..3 {
        let cur = match seen.take() {
            Some(cur) => cur,
            None => remote.read_versioned(&key).await?,
        };
        let expected = lease_expected_from(name, holder, from, steal, &cur)?;
        let was_ours = cur.as_ref().and_then(|(b, _)| Lease::decode(b).ok()).is_some_and(|l| l.holder == holder);
        let lease = Lease { holder: holder.to_string(), expires: now() + LEASE_SECS };
        if remote.cas_put(&key, expected.as_ref(), lease.encode()).await?.is_ok() {
            return Ok(was_ours);
        }
    }
    Err(Error::User(format!(
        "workspace {name}: the lease kept changing under us (another working copy is taking it); try again"
    )))
}

/// Whether `holder` may take the lease as read in `cur`: the version its
/// conditional PUT must replace (`None`: there is no lease object yet), or
/// [`Error::LeaseHeld`] when another holder keeps it (an expired one
/// only without `steal`).
pub fn lease_expected(name: &str, holder: &str, steal: bool, cur: &Seen) -> Result<Option<RefVersion>> {
    lease_expected_from(name, holder, None, steal, cur)
}

/// [`lease_expected`], a lease held by `from` counting as `holder`'s.
fn lease_expected_from(
    name: &str,
    holder: &str,
    from: Option<&str>,
    steal: bool,
    cur: &Seen,
) -> Result<Option<RefVersion>> {
    Ok(match cur {
        None => None,
        Some((bytes, ver)) => match Lease::decode(bytes) {
            // Damaged: never read as free, nor as another holder's.
            Err(e) if !steal => {
                return Err(Error::User(format!(
                    "the lease of workspace {name} (leases/ws/{name} in the store) does not decode: {e}; \
                     whoever held it, `--steal` replaces it (a holder whose checkpoint it was then loses it)"
                )))
            }
            Err(_) => Some(ver.clone()),
            Ok(l) if l.holder == holder || l.holder.is_empty() || from == Some(l.holder.as_str()) => Some(ver.clone()),
            Ok(l) if l.expires > now() || !steal => {
                return Err(Error::LeaseHeld {
                    name: name.to_string(),
                    holder: l.holder,
                    expires: l.expires,
                    expired: l.expires <= now(),
                })
            }
            // Expired and stolen.
            Ok(_) => Some(ver.clone()),
        },
    })
}

/// Gives up `holder`'s lease of workspace `name`, so another working copy
/// can take it at once (without --steal). Returns false when `holder` did
/// not hold it (nothing is changed then).
pub async fn release_lease(remote: &Remote, name: &str, holder: &str) -> Result<bool> {
    let key = remote.key(&crate::store::layout::lease(&ws_ref(name)?));
    for _ in 0..3 {
        let Some((bytes, ver)) = remote.read_versioned(&key).await? else { return Ok(false) };
        match Lease::decode(&bytes) {
            Ok(l) if l.holder == holder => {}
            _ => return Ok(false),
        }
        let released = Lease { holder: String::new(), expires: 0 };
        if remote.cas_put(&key, Some(&ver), released.encode()).await?.is_ok() {
            return Ok(true);
        }
    }
    Err(Error::User(format!("workspace {name}: the lease kept changing under us; try again")))
}

/// Releases the lease that the interrupted resume whose partial copy `dir`
/// holds took (see [`super::interrupted_resume_of`]); its files stay.
/// `None` when `dir` holds no such copy. `expect`: the workspace the user
/// named, refused (before anything is released) if the copy is another's.
pub async fn release_interrupted(
    fetcher: &Arc<Fetcher>,
    dir: &Path,
    expect: Option<&str>,
) -> Result<Option<(String, bool)>> {
    let Some((name, holder)) = super::interrupted_resume_of(dir) else { return Ok(None) };
    if let Some(n) = expect.filter(|n| *n != name) {
        return Err(Error::User(format!(
            "{} holds the partial copy of an interrupted resume of workspace {name}, not {n}",
            dir.display()
        )));
    }
    if holder.is_empty() {
        return Ok(Some((name, false)));
    }
    let released = release_lease(&fetcher.remote, &name, &holder).await?;
    Ok(Some((name, released)))
}

/// Releases the lease a plain working copy at `dir` holds.
pub async fn release(fetcher: &Arc<Fetcher>, dir: &Path) -> Result<(String, bool)> {
    let st = load_state(dir)?;
    let released = release_lease(&fetcher.remote, &st.name, &st.holder).await?;
    Ok((st.name, released))
}

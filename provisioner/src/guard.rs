//! Per-object operation guards: a second concurrent operation on the same volume or snapshot is
//! refused with [`Error::Busy`] (ABORTED) instead of racing the first one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A set of keys currently being operated on.
#[derive(Debug, Default, Clone)]
pub struct OpGuards {
    inner: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation runs; releases its keys on drop (also on panic or early return).
#[derive(Debug)]
pub struct OpGuard {
    set: Arc<Mutex<HashSet<String>>>,
    keys: Vec<String>,
}

impl OpGuards {
    /// Takes all `keys` at once, or none of them if any is held.
    pub fn try_lock<I, S>(&self, keys: I) -> Result<OpGuard>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        let mut set = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = keys.iter().find(|k| set.contains(*k)) {
            return Err(Error::Busy(k.clone()));
        }
        let mut taken = Vec::with_capacity(keys.len());
        for k in keys {
            if set.insert(k.clone()) {
                taken.push(k);
            }
        }
        Ok(OpGuard {
            set: self.inner.clone(),
            keys: taken,
        })
    }

    /// Whether a key is currently held.
    pub fn is_locked(&self, key: &str) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            set.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn second_lock_is_aborted_until_release() {
        let g = OpGuards::default();
        let a = g.try_lock(["vol-a"]).unwrap();
        let err = g.try_lock(["vol-a"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Aborted);
        assert!(g.try_lock(["vol-b"]).is_ok());
        drop(a);
        assert!(!g.is_locked("vol-a"));
        assert!(g.try_lock(["vol-a"]).is_ok());
    }

    #[test]
    fn multi_key_lock_is_all_or_nothing() {
        let g = OpGuards::default();
        let _b = g.try_lock(["b"]).unwrap();
        assert!(g.try_lock(["a", "b"]).is_err());
        assert!(
            !g.is_locked("a"),
            "a must not stay locked after a failed multi-lock"
        );
        let ab = g.try_lock(["a", "c", "a"]).unwrap();
        drop(ab);
        assert!(!g.is_locked("a") && !g.is_locked("c"));
    }

    #[test]
    fn released_on_panic() {
        let g = OpGuards::default();
        let g2 = g.clone();
        let r = std::panic::catch_unwind(move || {
            let _k = g2.try_lock(["p"]).unwrap();
            panic!("boom");
        });
        assert!(r.is_err());
        assert!(!g.is_locked("p"));
    }
}
